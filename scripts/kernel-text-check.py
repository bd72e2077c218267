#!/usr/bin/env python3
"""Checks that a refactor of cuda/kernels that moves code between files kept
the code itself, for a machine without nvcc (scripts/ptx-check.sh, which
compares the PTX, needs one). It expands the kernels image
(asynctp_kernels.cu: every local #include in order, each header once, as
#pragma once does) at a git revision and in the working tree (or at a
second revision), removes the
comments, the #include and #pragma once lines and the blank lines, cuts the
rest into top-level units (a definition from its first line to the line
that closes it, a namespace block, a declaration, a preprocessor line) and
compares the two multisets of units: every unit of code must be there,
byte for byte, on both sides, wherever it now lives. Units that are only
on the new side and are declarations (no body) are listed and allowed:
they add no code. Comments may change. Exit status 1 when code differs.

    python3 scripts/kernel-text-check.py REV [REV2]
"""
import collections
import os
import re
import subprocess
import sys

KDIR = 'cuda/kernels'
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def reader(rev):
    if rev is None:
        def read(path):
            with open(path) as f:
                return f.read()
        return read

    def read(path):
        return subprocess.run(['git', 'show', f'{rev}:{path}'], check=True, capture_output=True, text=True).stdout
    return read


def exists(read, path):
    try:
        read(path)
        return True
    except (OSError, subprocess.CalledProcessError):
        return False


def expand(read, name, seen, out):
    """Appends the lines of the image rooted at name to out (local includes
    expanded in place, each once)."""
    path = os.path.normpath(os.path.join(KDIR, name))
    for line in read(path).split('\n'):
        m = INCLUDE.match(line)
        if m:
            inc = os.path.normpath(os.path.join(os.path.dirname(name), m.group(1)))
            if exists(read, os.path.join(KDIR, inc)):
                if inc not in seen:
                    seen.add(inc)
                    expand(read, inc, seen, out)
                continue
        out.append(line)


def strip_comments(text):
    """Removes // and /* */ comments outside string and character literals."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c in '"\'':
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith('//', i):
            while i < n and text[i] != '\n':
                i += 1
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            out.append('\n' * text.count('\n', i, j))
            i = j + 2
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def units(lines):
    """Cuts code lines into top-level units."""
    text = strip_comments('\n'.join(lines))
    code = [l.rstrip() for l in text.split('\n')]
    code = [l for l in code if l.strip() and l.strip() != '#pragma once']
    res, cur, depth, cont = [], [], 0, False
    for l in code:
        if depth == 0 and not cur and l.lstrip().startswith('#'):
            res.append(l)  # a preprocessor line (with its continuation lines)
            cont = l.endswith('\\')
            continue
        if cont:
            res[-1] += '\n' + l
            cont = l.endswith('\\')
            continue
        cur.append(l)
        depth += l.count('{') - l.count('}')
        if depth == 0 and (l.endswith('}') or l.endswith(';') or l.endswith('};')):
            res.append('\n'.join(cur))
            cur = []
    if cur:
        res.append('\n'.join(cur))
    return res


def image_units(rev):
    read = reader(rev)
    lines = []
    expand(read, 'asynctp_kernels.cu', {'asynctp_kernels.cu'}, lines)
    return units(lines)


def is_declaration(u):
    return '{' not in u and u.rstrip().endswith(';') and not u.lstrip().startswith('#')


def main(rev, rev2=None):
    before, after = collections.Counter(image_units(rev)), collections.Counter(image_units(rev2))
    where = rev2 or 'the working tree'
    gone = before - after
    added = after - before
    decls = [u for u in added.elements() if is_declaration(u)]
    code = [u for u in added.elements() if not is_declaration(u)]
    kept = sum((before & after).values())
    print(f'{kept} units of code identical (of {sum(before.values())} at {rev}), {len(decls)} declarations added')
    for u in gone.elements():
        print('only at ' + rev + ':\n' + u + '\n')
    for u in code:
        print('only in ' + where + ':\n' + u + '\n')
    return 1 if gone or code else 0


if __name__ == '__main__':
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
