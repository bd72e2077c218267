package rendezvous

import (
	"slices"
	"strings"
	"testing"
)

func TestExpandNodeList(t *testing.T) {
	for _, tc := range []struct {
		list string
		want []string
	}{
		{"gpu[001-004,007],login1", []string{"gpu001", "gpu002", "gpu003", "gpu004", "gpu007", "login1"}},
		{"node1", []string{"node1"}},
		{" a , b ,", []string{"a", "b"}},
		{"n[8-11]", []string{"n8", "n9", "n10", "n11"}},
		{"n[08-11]", []string{"n08", "n09", "n10", "n11"}},
		{"n[3]", []string{"n3"}},
		{"n[098-101]", []string{"n098", "n099", "n100", "n101"}},
		{"r[1-2]n[01-02]", []string{"r1n01", "r1n02", "r2n01", "r2n02"}},
		{"gpu[1-2]-ib,cpu[5]", []string{"gpu1-ib", "gpu2-ib", "cpu5"}},
		{"[1-2]", []string{"1", "2"}},
		{"a-b.example.com,c", []string{"a-b.example.com", "c"}},
	} {
		got, err := ExpandNodeList(tc.list)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ExpandNodeList(%q) = %q, %v; want %q", tc.list, got, err, tc.want)
		}
	}
}

func TestExpandNodeListErrors(t *testing.T) {
	for _, tc := range []struct{ list, wantErr string }{
		{"", "names no host"},
		{" , ", "names no host"},
		{"gpu[1-", "unterminated bracket"},
		{"gpu]1[", "unbalanced or nested brackets at byte 3"},
		{"gpu[[1]]", "unbalanced or nested brackets at byte 4"},
		{"gpu[4-1]", `range "4-1" in "gpu[4-1]"`},
		{"gpu[a-b]", `range "a-b"`},
		{"gpu[]", `range ""`},
		{"gpu[1-]", `range "1-"`},
		{"gpu[+1]", `range "+1"`},
		{"gpu[1-2-3]", `range "1-2-3"`},
		{"n[0-99999999]", "expands to more than 65536 hosts"},
	} {
		got, err := ExpandNodeList(tc.list)
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("ExpandNodeList(%q) = %q, %v; want an error containing %q", tc.list, got, err, tc.wantErr)
		}
	}
}

func TestFirstNodeOfHugeList(t *testing.T) {
	// The master's address only needs the first host: no full expansion.
	got, err := expandNodeList("n[0-99999999]x[1-99999999],other", 1)
	if err != nil || !slices.Equal(got, []string{"n0x1"}) {
		t.Fatalf("expandNodeList(limit 1) = %q, %v; want [n0x1]", got, err)
	}
}

func TestParseTasksPerNode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"4", []int{4}},
		{"4(x2)", []int{4, 4}},
		{"4(x2),3", []int{4, 4, 3}},
		{"1,2(x3), 5", []int{1, 2, 2, 2, 5}},
	} {
		got, err := parseTasksPerNode(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseTasksPerNode(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "x", "4(x)", "4(2)", "0", "4(x0)", "4(x2", "-1", "4(x2),", "1(x99999999)"} {
		if got, err := parseTasksPerNode(in); err == nil {
			t.Errorf("parseTasksPerNode(%q) = %v, want an error", in, got)
		}
	}
}
