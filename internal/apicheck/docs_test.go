package apicheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// documented are the packages whose every exported identifier, struct
// field and interface method must have a doc comment (or, for a field or
// a method, a comment on its line).
var documented = []string{
	"tensor", "layers", "parallel/tp", "parallel/ep", "overlap", "comm",
	"comm/local", "optim", "safetensors", "parallel/shard", "parallel/grads", "tokens",
}

// repoRoot is the module's root, two levels above this package.
func repoRoot(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "..")
}

// TestDocComments parses the documented packages (their non-test files)
// and lists every exported name without a comment, with its position.
func TestDocComments(t *testing.T) {
	root := repoRoot(t)
	for _, pkg := range documented {
		missing, err := undocumented(filepath.Join(root, pkg))
		if err != nil {
			t.Fatalf("%s: %v", pkg, err)
		}
		for _, m := range missing {
			rel, _ := filepath.Rel(root, m)
			t.Errorf("%s lacks a doc comment", rel)
		}
	}
}

// undocumented returns "file:line: what" for every exported declaration of
// the package in dir that has no comment.
func undocumented(dir string) ([]string, error) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	if len(pkgs) != 1 {
		return nil, fmt.Errorf("%d packages in %s, expected one", len(pkgs), dir)
	}
	var out []string
	add := func(pos token.Pos, what string) {
		p := fset.Position(pos)
		out = append(out, fmt.Sprintf("%s:%d: %s", p.Filename, p.Line, what))
	}
	has := func(cgs ...*ast.CommentGroup) bool {
		for _, cg := range cgs {
			if cg != nil && strings.TrimSpace(cg.Text()) != "" {
				return true
			}
		}
		return false
	}
	for _, pkg := range pkgs {
		exportedTypes := map[string]bool{}
		for _, f := range pkg.Files {
			for _, d := range f.Decls {
				if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
					for _, s := range g.Specs {
						if ts := s.(*ast.TypeSpec); ts.Name.IsExported() {
							exportedTypes[ts.Name.Name] = true
						}
					}
				}
			}
		}
		for _, f := range pkg.Files {
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if !d.Name.IsExported() {
						continue
					}
					name := d.Name.Name
					if d.Recv != nil {
						recv := receiverType(d.Recv.List[0].Type)
						if !exportedTypes[recv] {
							continue
						}
						name = recv + "." + name
					}
					if !has(d.Doc) {
						add(d.Pos(), "func "+name)
					}
				case *ast.GenDecl:
					for _, s := range d.Specs {
						switch s := s.(type) {
						case *ast.TypeSpec:
							if !s.Name.IsExported() {
								continue
							}
							if !has(s.Doc, d.Doc) {
								add(s.Pos(), "type "+s.Name.Name)
							}
							checkMembers(s.Name.Name, s.Type, add, has)
						case *ast.ValueSpec:
							for _, n := range s.Names {
								if n.IsExported() && !has(s.Doc, s.Comment, d.Doc) {
									add(n.Pos(), strings.ToLower(d.Tok.String())+" "+n.Name)
								}
							}
						}
					}
				}
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// checkMembers reports the exported fields of a struct type and the
// methods of an interface type that have no comment.
func checkMembers(typ string, x ast.Expr, add func(token.Pos, string), has func(...*ast.CommentGroup) bool) {
	switch x := x.(type) {
	case *ast.StructType:
		for _, f := range x.Fields.List {
			if len(f.Names) == 0 { // embedded
				if name := receiverType(f.Type); ast.IsExported(name) && !has(f.Doc, f.Comment) {
					add(f.Pos(), "embedded field "+typ+"."+name)
				}
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() && !has(f.Doc, f.Comment) {
					add(n.Pos(), "field "+typ+"."+n.Name)
				}
			}
		}
	case *ast.InterfaceType:
		for _, m := range x.Methods.List {
			for _, n := range m.Names {
				if n.IsExported() && !has(m.Doc, m.Comment) {
					add(n.Pos(), "method "+typ+"."+n.Name)
				}
			}
		}
	}
}

// receiverType is the type name of a receiver or embedded field: T, *T,
// T[P], pkg.T.
func receiverType(x ast.Expr) string {
	switch x := x.(type) {
	case *ast.StarExpr:
		return receiverType(x.X)
	case *ast.IndexExpr:
		return receiverType(x.X)
	case *ast.IndexListExpr:
		return receiverType(x.X)
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.Ident:
		return x.Name
	}
	return ""
}
