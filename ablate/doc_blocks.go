package ablate

import (
	"encoding/base64"
	"fmt"
	"html"
	"strings"
)

// block is a piece of the report, rendered alike to Markdown and HTML.
type block struct {
	kind string // h1, h2, p, table, img, pre
	text string
	head []string
	rows [][]string
	png  []byte // img: the chart, inlined in the HTML
	file string // img: its file next to report.md
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

func renderMD(bs []block) string {
	var b strings.Builder
	for _, x := range bs {
		switch x.kind {
		case "h1":
			fmt.Fprintf(&b, "# %s\n\n", x.text)
		case "h2":
			fmt.Fprintf(&b, "## %s\n\n", x.text)
		case "p":
			fmt.Fprintf(&b, "%s\n\n", x.text)
		case "pre":
			fmt.Fprintf(&b, "```\n%s\n```\n\n", strings.TrimRight(x.text, "\n"))
		case "img":
			fmt.Fprintf(&b, "![%s](%s)\n\n", x.text, x.file)
		case "table":
			if len(x.rows) == 0 {
				b.WriteString("(none)\n\n")
				continue
			}
			esc := func(c []string) string {
				o := make([]string, len(c))
				for i, s := range c {
					o[i] = mdEscape(s)
				}
				return "| " + strings.Join(o, " | ") + " |\n"
			}
			b.WriteString(esc(x.head))
			b.WriteString("|" + strings.Repeat(" --- |", len(x.head)) + "\n")
			for _, r := range x.rows {
				b.WriteString(esc(r))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

func renderHTML(title string, bs []block) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>%s</title>\n", html.EscapeString(title))
	b.WriteString(`<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}
table{border-collapse:collapse;font-size:13px;margin-bottom:1em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#eee}td:first-child,th:first-child{text-align:left}pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}
img{max-width:100%;border:1px solid #ddd}</style></head><body>
`)
	for _, x := range bs {
		switch x.kind {
		case "h1", "h2":
			fmt.Fprintf(&b, "<%s>%s</%s>\n", x.kind, html.EscapeString(x.text), x.kind)
		case "p":
			fmt.Fprintf(&b, "<p>%s</p>\n", html.EscapeString(strings.ReplaceAll(x.text, "`", "")))
		case "pre":
			fmt.Fprintf(&b, "<pre>%s</pre>\n", html.EscapeString(x.text))
		case "img":
			fmt.Fprintf(&b, "<p><img alt=\"%s\" src=\"data:image/png;base64,%s\"></p>\n", html.EscapeString(x.text), base64.StdEncoding.EncodeToString(x.png))
		case "table":
			if len(x.rows) == 0 {
				b.WriteString("<p>(none)</p>\n")
				continue
			}
			b.WriteString("<table><tr>")
			for _, h := range x.head {
				fmt.Fprintf(&b, "<th>%s</th>", html.EscapeString(h))
			}
			b.WriteString("</tr>\n")
			for _, r := range x.rows {
				b.WriteString("<tr>")
				for _, c := range r {
					fmt.Fprintf(&b, "<td>%s</td>", html.EscapeString(c))
				}
				b.WriteString("</tr>\n")
			}
			b.WriteString("</table>\n")
		}
	}
	b.WriteString("</body></html>\n")
	return b.String()
}
