#!/usr/bin/env python3
"""Compares two PTX files function by function (every .entry and .func,
each up to the next one, so inline asm blocks with braces do not end a
function early): byte-identical, identical modulo register and label names,
the same instructions in another order, or different. Exit status 1 when a
function differs or is missing from one side, 0 otherwise.

    python3 scripts/ptx-compare.py before.ptx after.ptx

scripts/ptx-check.sh builds the two files from git revisions.
"""
import re
import sys

HEAD = re.compile(r'^(?:\.visible |\.weak |\.extern )?\.(?:entry|func)\s[^\n]*?(\w+)\(', re.M)


def functions(path):
    text = open(path).read()
    marks = list(HEAD.finditer(text))
    # A region ends with the next function's ".globl" comment: not part of it.
    return {m.group(1): re.sub(r'\s*// \.globl\s+\w+\s*$', '\n',
                               text[m.start():(marks[i + 1].start() if i + 1 < len(marks) else len(text))])
            for i, m in enumerate(marks)}


def normal(body):
    body = re.sub(r'%[a-z]+\d+', '%R', body)
    return re.sub(r'\$L__BB\d+_\d+', '$L', body)


def main(a_path, b_path):
    a, b = functions(a_path), functions(b_path)
    counts = {'identical': 0, 'renamed': 0}
    bad = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f'only in {a_path if name in a else b_path}: {name}')
            bad += 1
        elif a[name] == b[name]:
            counts['identical'] += 1
        elif normal(a[name]) == normal(b[name]):
            counts['renamed'] += 1
        else:
            na, nb = normal(a[name]).splitlines(), normal(b[name]).splitlines()
            how = 'the same instructions reordered' if sorted(na) == sorted(nb) else 'different instructions'
            print(f'{name}: {how} ({len(na)} and {len(nb)} lines)')
            bad += 1
    print(f'{len(a)} and {len(b)} functions: {counts["identical"]} byte-identical, '
          f'{counts["renamed"]} identical modulo register and label names, {bad} otherwise')
    return 1 if bad else 0


if __name__ == '__main__':
    if len(sys.argv) != 3:
        sys.exit('usage: ptx-compare.py BEFORE.ptx AFTER.ptx')
    sys.exit(main(sys.argv[1], sys.argv[2]))
