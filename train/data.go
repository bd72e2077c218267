package train

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"

	"github.com/asynctp/asynctp/tensor"
)

// Dataset is a sequence of token ids with the name of where it came from
// (a file path, or a name given to in-memory data), used in error messages.
type Dataset struct {
	Name   string
	Tokens []uint16
}

// ReadDataset reads a token file: a ".bin" file is a flat array of
// little-endian uint16 token ids; any other file is text, one token per byte
// (vocabulary 256).
func ReadDataset(path string) (*Dataset, error) {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("train: data file %s does not exist", path)
	}
	if err != nil {
		return nil, fmt.Errorf("train: data file %s: %w", path, err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("train: data file %s is a directory, want a text file or a .bin file of uint16 tokens", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("train: reading data file %s: %w", path, err)
	}
	if strings.EqualFold(filepath.Ext(path), ".bin") {
		return BinDataset(path, data)
	}
	return BytesDataset(path, data)
}

// BytesDataset makes a byte-level dataset (one token per byte, vocabulary
// 256) from data, which is copied. name is used in error messages.
func BytesDataset(name string, data []byte) (*Dataset, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("train: data file %s is empty", name)
	}
	toks := make([]uint16, len(data))
	for i, c := range data {
		toks[i] = uint16(c)
	}
	return &Dataset{Name: name, Tokens: toks}, nil
}

// BinDataset decodes data as little-endian uint16 token ids.
func BinDataset(name string, data []byte) (*Dataset, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("train: data file %s is empty", name)
	}
	if len(data)%2 != 0 {
		return nil, fmt.Errorf("train: data file %s has an odd length of %d bytes; a .bin file holds little-endian uint16 tokens (2 bytes each)", name, len(data))
	}
	toks := make([]uint16, len(data)/2)
	for i := range toks {
		toks[i] = binary.LittleEndian.Uint16(data[2*i:])
	}
	return &Dataset{Name: name, Tokens: toks}, nil
}

// Split returns the first part of the tokens for training and the last
// valFraction of them (at least one token) for validation. The two do not
// overlap. valFraction must be in (0, 1); 0.05 is the usual choice.
func (d *Dataset) Split(valFraction float64) (trainSet, valSet *Dataset, err error) {
	if !(valFraction > 0 && valFraction < 1) {
		return nil, nil, fmt.Errorf("train: validation fraction %v of %s, want in (0, 1)", valFraction, d.Name)
	}
	n := len(d.Tokens)
	nVal := max(int(float64(n)*valFraction), 1)
	if nVal >= n {
		return nil, nil, fmt.Errorf("train: data file %s has %d tokens, too few to split off a validation part", d.Name, n)
	}
	return &Dataset{Name: d.Name + " (train split)", Tokens: d.Tokens[:n-nVal]},
		&Dataset{Name: d.Name + " (validation split)", Tokens: d.Tokens[n-nVal:]}, nil
}

// LoaderConfig says how a Loader cuts its dataset into batches.
type LoaderConfig struct {
	Batch int    // sequences per batch (B)
	Seq   int    // tokens per sequence (T)
	Vocab int    // every token id must be < Vocab
	Seed  uint64 // seeds the per-epoch window order
	// Sequential visits windows in order instead of a seeded permutation
	// (validation).
	Sequential bool
}

// DataPosition is where a Loader is: the next window it yields is number
// Index of epoch Epoch's order. Windows and Seq describe the data it refers
// to, so a resume on different data is caught.
type DataPosition struct {
	Epoch   int    `json:"epoch"`
	Index   int    `json:"index"`
	Seed    uint64 `json:"seed"`
	Windows int    `json:"windows"`
	Seq     int    `json:"seq"`
}

// Loader yields batches of (inputs, targets) windows of a Dataset. The
// tokens are cut into non-overlapping windows of Seq+1 tokens (window i
// starts at token i·Seq, so consecutive windows share one token); each epoch
// visits all windows once, in an order given by a permutation seeded by
// (Seed, epoch). A batch that runs past the end of an epoch continues into
// the next one.
type Loader struct {
	ds      *Dataset
	cfg     LoaderConfig
	windows int
	epoch   int
	index   int
	perm    []int // order of the current epoch; nil when sequential
}

// NewLoader checks the dataset against cfg (enough tokens for one window,
// every id below the vocabulary) and returns a loader at epoch 0, index 0.
func NewLoader(ds *Dataset, cfg LoaderConfig) (*Loader, error) {
	if ds == nil {
		return nil, fmt.Errorf("train: NewLoader: nil dataset")
	}
	if cfg.Batch <= 0 || cfg.Seq <= 0 {
		return nil, fmt.Errorf("train: loader for %s: batch %d and seq %d, want both > 0", ds.Name, cfg.Batch, cfg.Seq)
	}
	if cfg.Vocab <= 0 {
		return nil, fmt.Errorf("train: loader for %s: vocabulary size %d, want > 0", ds.Name, cfg.Vocab)
	}
	n := len(ds.Tokens)
	if n == 0 {
		return nil, fmt.Errorf("train: data file %s is empty", ds.Name)
	}
	if n < cfg.Seq+1 {
		return nil, fmt.Errorf("train: data file %s has %d tokens, fewer than seq+1 = %d needed for one training window", ds.Name, n, cfg.Seq+1)
	}
	for i, t := range ds.Tokens {
		if int(t) >= cfg.Vocab {
			return nil, fmt.Errorf("train: data file %s holds token id %d at position %d, but the model's vocabulary has %d ids (0..%d)", ds.Name, t, i, cfg.Vocab, cfg.Vocab-1)
		}
	}
	l := &Loader{ds: ds, cfg: cfg, windows: (n - 1) / cfg.Seq}
	l.setEpoch(0)
	return l, nil
}

// OpenLoader is ReadDataset followed by NewLoader.
func OpenLoader(path string, cfg LoaderConfig) (*Loader, error) {
	ds, err := ReadDataset(path)
	if err != nil {
		return nil, err
	}
	return NewLoader(ds, cfg)
}

// Name is the dataset's name.
func (l *Loader) Name() string { return l.ds.Name }

// Config returns the loader's configuration.
func (l *Loader) Config() LoaderConfig { return l.cfg }

// Windows is the number of windows of one epoch.
func (l *Loader) Windows() int { return l.windows }

// Tokens is the number of tokens of the dataset.
func (l *Loader) Tokens() int { return len(l.ds.Tokens) }

// Position returns where the next batch starts.
func (l *Loader) Position() DataPosition {
	return DataPosition{Epoch: l.epoch, Index: l.index, Seed: l.cfg.Seed, Windows: l.windows, Seq: l.cfg.Seq}
}

// Seek moves to a position returned by Position (of a loader over the same
// data with the same seed and seq).
func (l *Loader) Seek(p DataPosition) error {
	if p.Seq != l.cfg.Seq || p.Windows != l.windows || p.Seed != l.cfg.Seed {
		return fmt.Errorf("train: data position was saved for %d windows of seq %d with seed %d, but the loader of %s has %d windows of seq %d with seed %d",
			p.Windows, p.Seq, p.Seed, l.ds.Name, l.windows, l.cfg.Seq, l.cfg.Seed)
	}
	if p.Epoch < 0 || p.Index < 0 || p.Index >= l.windows {
		return fmt.Errorf("train: data position epoch %d index %d out of range (index must be in [0, %d))", p.Epoch, p.Index, l.windows)
	}
	l.setEpoch(p.Epoch)
	l.index = p.Index
	return nil
}

// Reset goes back to epoch 0, index 0.
func (l *Loader) Reset() {
	l.setEpoch(0)
}

func (l *Loader) setEpoch(e int) {
	l.epoch, l.index = e, 0
	if l.cfg.Sequential {
		l.perm = nil
		return
	}
	// A PCG stream per (seed, epoch): the order of an epoch does not depend
	// on how the loader got there.
	rng := rand.New(rand.NewPCG(l.cfg.Seed, uint64(e)*0x9e3779b97f4a7c15+0x632be59bd9b4e019))
	if cap(l.perm) >= l.windows {
		l.perm = l.perm[:l.windows]
		for i := range l.perm {
			l.perm[i] = i
		}
		rng.Shuffle(len(l.perm), func(i, j int) { l.perm[i], l.perm[j] = l.perm[j], l.perm[i] })
	} else {
		l.perm = rng.Perm(l.windows)
	}
}

// Next returns the next batch: inputs and targets are new host int32
// tensors of shape (Batch, Seq), targets[b, t] = inputs[b, t+1] of the same
// window.
func (l *Loader) Next() (inputs, targets *tensor.Tensor, err error) {
	B, T := l.cfg.Batch, l.cfg.Seq
	in := make([]int32, B*T)
	tg := make([]int32, B*T)
	for b := range B {
		if l.index >= l.windows {
			l.setEpoch(l.epoch + 1)
		}
		w := l.index
		if l.perm != nil {
			w = l.perm[l.index]
		}
		l.index++
		toks := l.ds.Tokens[w*T : w*T+T+1]
		for t := range T {
			in[b*T+t] = int32(toks[t])
			tg[b*T+t] = int32(toks[t+1])
		}
	}
	if l.index >= l.windows { // normalise: a position always has index < windows
		l.setEpoch(l.epoch + 1)
	}
	if inputs, err = tensor.FromInt32(in, B, T); err != nil {
		return nil, nil, err
	}
	if targets, err = tensor.FromInt32(tg, B, T); err != nil {
		return nil, nil, err
	}
	return inputs, targets, nil
}
