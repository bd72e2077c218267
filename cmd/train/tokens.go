package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"

	"github.com/asynctp/asynctp/tokens"
	"github.com/asynctp/asynctp/train"
)

// runTokens is "train tokens --format F --out PATH [--width W] [--offset N]
// FILE...": it writes the bytes of the text files as token ids (byte b is
// id b + offset) in one of the formats --data reads, so that any of them
// can be tried on a fresh clone: uint16 or uint32 (raw ids of all files
// one after another), llmc (one shard of them), megatron (PATH.bin and
// PATH.idx, one document per file).
func runTokens(args []string) error {
	fl := flag.NewFlagSet("train tokens", flag.ContinueOnError)
	format := fl.String("format", "", "the format to write: uint16, uint32, llmc or megatron")
	out := fl.String("out", "", "the file to write (megatron: the `prefix` of PREFIX.bin and PREFIX.idx), in a directory made if needed; it must not exist")
	width := fl.Int("width", 0, "bytes per id for llmc and megatron: 2 (uint16) or 4 (llm.c uint32, Megatron int32); default 2 if every id fits, else 4")
	offset := fl.Int("offset", 0, "added to every byte: the ids are offset to offset+255 (a vocabulary of offset+256)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *out == "" || fl.NArg() == 0 {
		return fmt.Errorf("tokens: expected --format F --out PATH FILE..., found %q", args)
	}
	if *offset < 0 || *offset > tokens.MaxID-255 {
		return fmt.Errorf("tokens: --offset %d, expected 0 to %d", *offset, tokens.MaxID-255)
	}
	var docs [][]int32
	maxID := int32(0)
	for _, path := range fl.Args() {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("tokens: %w", err)
		}
		if len(b) == 0 {
			return fmt.Errorf("tokens: %s is empty", path)
		}
		ids := make([]int32, len(b))
		for i, c := range b {
			ids[i] = int32(c) + int32(*offset)
			maxID = max(maxID, ids[i])
		}
		docs = append(docs, ids)
	}
	w := *width
	switch tokens.Format(*format) {
	case tokens.Uint16:
		w = orWidth(w, 2)
	case tokens.Uint32:
		w = orWidth(w, 4)
	case tokens.LLMC, tokens.Megatron:
		if w == 0 {
			w = 2
			if maxID > math.MaxUint16 {
				w = 4
			}
		}
	default:
		return fmt.Errorf("tokens: --format %q, expected uint16, uint32, llmc or megatron", *format)
	}
	if (tokens.Format(*format) == tokens.Uint16 && w != 2) || (tokens.Format(*format) == tokens.Uint32 && w != 4) {
		return fmt.Errorf("tokens: --format %s with --width %d: the format's ids are %d bytes", *format, *width, map[string]int{"uint16": 2, "uint32": 4}[*format])
	}
	paths := []string{*out}
	if tokens.Format(*format) == tokens.Megatron {
		paths = []string{*out + ".bin", *out + ".idx"}
	}
	for _, p := range paths {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("tokens: %s exists; remove it or write elsewhere", p)
		}
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return fmt.Errorf("tokens: %w", err)
	}
	var all []int32
	for _, d := range docs {
		all = append(all, d...)
	}
	var buf bytes.Buffer
	var err error
	switch tokens.Format(*format) {
	case tokens.Uint16, tokens.Uint32:
		err = tokens.WriteRaw(&buf, all, w)
	case tokens.LLMC:
		err = tokens.WriteLLMC(&buf, all, w)
	case tokens.Megatron:
		err = tokens.WriteMegatron(*out, docs, w)
	}
	if err == nil && buf.Len() > 0 {
		err = train.WriteFileAtomic(*out, buf.Bytes())
	}
	if err != nil {
		return err
	}
	files := "files"
	if len(docs) == 1 {
		files = "file"
	}
	fmt.Printf("tokens: %d ids (%d to %d) of %d %s → %s, %s of %d-byte ids\n", len(all), *offset, maxID, len(docs), files, *out, *format, w)
	return nil
}

func orWidth(w, def int) int {
	if w == 0 {
		return def
	}
	return w
}
