package train

import (
	"fmt"
	"math/rand/v2"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tokens"
)

// SplitValidation returns the first part of ds's tokens for training and
// the last valFraction of them (at least one token) for validation, as views
// of ds. The two do not overlap. valFraction must be in (0, 1); 0.05 is the
// usual choice.
func SplitValidation(ds *tokens.Stream, valFraction float64) (trainSet, valSet *tokens.Stream, err error) {
	if !(valFraction > 0 && valFraction < 1) {
		return nil, nil, fmt.Errorf("train: validation fraction %v of %s, want in (0, 1)", valFraction, ds.Name())
	}
	n := ds.Len()
	nVal := max(int64(float64(n)*valFraction), 1)
	if nVal >= n {
		return nil, nil, fmt.Errorf("train: data file %s has %d tokens, too few to split off a validation part", ds.Name(), n)
	}
	if trainSet, err = ds.Slice(0, n-nVal, ds.Name()+" (train split)"); err != nil {
		return nil, nil, err
	}
	if valSet, err = ds.Slice(n-nVal, n, ds.Name()+" (validation split)"); err != nil {
		return nil, nil, err
	}
	return trainSet, valSet, nil
}

// CheckAllTokens is the size up to which NewLoader checks every token id
// of a dataset against the vocabulary before the first batch. A larger
// dataset starts at once and is checked window by window as Next reads it:
// an id outside the vocabulary then stops the run at the step that reads
// it, with the same error.
const CheckAllTokens = 1 << 26

// checkAllTokens is CheckAllTokens, lowered by tests.
var checkAllTokens int64 = CheckAllTokens

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

// The window orders of a DataPosition.
const (
	// OrderFeistel is the order of every new loader: a permutation
	// computed one window at a time (see Loader), which takes no memory
	// however many windows there are.
	OrderFeistel = "feistel"
	// OrderDrawn, the empty string, is the order of checkpoints written
	// before OrderFeistel: each epoch's permutation drawn whole
	// (rand.Perm of a PCG seeded by the seed and the epoch). A loader
	// that resumes such a position keeps that order, so the run goes on
	// as it would have.
	OrderDrawn = ""
)

// DataPosition is where a Loader is: the next window it yields is number
// Index of epoch Epoch's order. Windows and Seq describe the data it refers
// to, so a resume on different data is caught; Order names the window order.
type DataPosition struct {
	Epoch   int    `json:"epoch"`
	Index   int    `json:"index"`
	Seed    uint64 `json:"seed"`
	Windows int    `json:"windows"`
	Seq     int    `json:"seq"`
	Order   string `json:"order,omitempty"`
}

// Loader yields batches of (inputs, targets) windows of a tokens.Stream:
// files of any format and size opened as one stream (tokens.Open), or ids
// held in memory (tokens.FromBytes, tokens.FromIDs); the stream's name is
// used in messages. The tokens are cut into non-overlapping windows of
// Seq+1 tokens (window i starts at token i·Seq, so consecutive windows share
// one token); each epoch visits all windows once, in an order given by a
// pseudo-random permutation of the window numbers keyed by (Seed, epoch). A
// batch that runs past the end of an epoch continues into the next one.
//
// The permutation (OrderFeistel) is a balanced Feistel network over the
// window numbers' bits with cycle walking: window i of an epoch is computed
// from i alone, so a loader holds nothing per window, and its memory is one
// window's tokens whatever the size of the dataset. Next reads each window
// from the dataset when it is needed (tokens.Stream maps its files).
type Loader struct {
	ds      *tokens.Stream
	cfg     LoaderConfig
	windows int
	epoch   int
	index   int
	order   string
	perm    permutation // the current epoch's, for OrderFeistel
	drawn   []int       // the current epoch's, for OrderDrawn
	checked bool        // every id was checked against the vocabulary at NewLoader
	buf     []int32     // one window
}

// NewLoader checks the dataset against cfg (enough tokens for one window,
// and, for a dataset of at most CheckAllTokens tokens, every id below the
// vocabulary) and returns a loader at epoch 0, index 0.
func NewLoader(ds *tokens.Stream, cfg LoaderConfig) (*Loader, error) {
	if ds == nil {
		return nil, fmt.Errorf("train: NewLoader: nil dataset")
	}
	if cfg.Batch <= 0 || cfg.Seq <= 0 {
		return nil, fmt.Errorf("train: loader for %s: batch %d and seq %d, want both > 0", ds.Name(), cfg.Batch, cfg.Seq)
	}
	if cfg.Vocab <= 0 {
		return nil, fmt.Errorf("train: loader for %s: vocabulary size %d, want > 0", ds.Name(), cfg.Vocab)
	}
	n := ds.Len()
	if n == 0 {
		return nil, fmt.Errorf("train: data file %s is empty", ds.Name())
	}
	if n < int64(cfg.Seq)+1 {
		return nil, fmt.Errorf("train: data file %s has %d tokens, fewer than seq+1 = %d needed for one training window", ds.Name(), n, cfg.Seq+1)
	}
	l := &Loader{ds: ds, cfg: cfg, windows: int((n - 1) / int64(cfg.Seq)), order: OrderFeistel, buf: make([]int32, cfg.Seq+1)}
	if n <= checkAllTokens {
		chunk := make([]int32, min(n, 1<<16))
		for pos := int64(0); pos < n; pos += int64(len(chunk)) {
			c := chunk[:min(int64(len(chunk)), n-pos)]
			if err := ds.Read(c, pos); err != nil {
				return nil, err
			}
			if err := l.checkVocab(c, pos); err != nil {
				return nil, err
			}
		}
		l.checked = true
	}
	l.setEpoch(0)
	return l, nil
}

// checkVocab checks the ids of ids, which start at token pos.
func (l *Loader) checkVocab(ids []int32, pos int64) error {
	for i, t := range ids {
		if int(t) >= l.cfg.Vocab {
			file, at := l.ds.Locate(pos + int64(i))
			return fmt.Errorf("train: data file %s holds token id %d at position %d, but the model's vocabulary has %d ids (0..%d)", file, t, at, l.cfg.Vocab, l.cfg.Vocab-1)
		}
	}
	return nil
}

// Name is the dataset's name.
func (l *Loader) Name() string { return l.ds.Name() }

// Config returns the loader's configuration.
func (l *Loader) Config() LoaderConfig { return l.cfg }

// Windows is the number of windows of one epoch.
func (l *Loader) Windows() int { return l.windows }

// Tokens is the number of tokens of the dataset.
func (l *Loader) Tokens() int64 { return l.ds.Len() }

// Position returns where the next batch starts.
func (l *Loader) Position() DataPosition {
	return DataPosition{Epoch: l.epoch, Index: l.index, Seed: l.cfg.Seed, Windows: l.windows, Seq: l.cfg.Seq, Order: l.order}
}

// Seek moves to a position returned by Position (of a loader over the same
// data with the same seed and seq), in its window order.
func (l *Loader) Seek(p DataPosition) error {
	if p.Seq != l.cfg.Seq || p.Windows != l.windows || p.Seed != l.cfg.Seed {
		return fmt.Errorf("train: data position was saved for %d windows of seq %d with seed %d, but the loader of %s has %d windows of seq %d with seed %d",
			p.Windows, p.Seq, p.Seed, l.ds.Name(), l.windows, l.cfg.Seq, l.cfg.Seed)
	}
	if p.Epoch < 0 || p.Index < 0 || p.Index >= l.windows {
		return fmt.Errorf("train: data position epoch %d index %d out of range (index must be in [0, %d))", p.Epoch, p.Index, l.windows)
	}
	if p.Order != OrderFeistel && p.Order != OrderDrawn {
		return fmt.Errorf("train: data position in window order %q, which this build does not know (%q, or none for the order of older checkpoints)", p.Order, OrderFeistel)
	}
	l.order = p.Order
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
	l.drawn = nil
	switch {
	case l.cfg.Sequential:
	case l.order == OrderDrawn:
		// A PCG stream per (seed, epoch): the order of an epoch does not
		// depend on how the loader got there.
		rng := rand.New(rand.NewPCG(l.cfg.Seed, uint64(e)*0x9e3779b97f4a7c15+0x632be59bd9b4e019))
		l.drawn = rng.Perm(l.windows)
	default:
		l.perm = newPermutation(l.windows, l.cfg.Seed, e)
	}
}

// window is the window number at index i of the current epoch.
func (l *Loader) window(i int) int {
	switch {
	case l.cfg.Sequential:
		return i
	case l.drawn != nil:
		return l.drawn[i]
	}
	return l.perm.at(i)
}

// Next returns the next batch: inputs and targets are new host int32
// tensors of shape (Batch, Seq), targets[b, t] = inputs[b, t+1] of the same
// window. On error the position stays where the batch began.
func (l *Loader) Next() (inputs, targets *tensor.Tensor, err error) {
	B, T := l.cfg.Batch, l.cfg.Seq
	in := make([]int32, B*T)
	tg := make([]int32, B*T)
	epoch, index := l.epoch, l.index
	for b := range B {
		if l.index >= l.windows {
			l.setEpoch(l.epoch + 1)
		}
		w := l.window(l.index)
		l.index++
		if err := l.read(w); err != nil {
			l.setEpoch(epoch)
			l.index = index
			return nil, nil, err
		}
		copy(in[b*T:(b+1)*T], l.buf[:T])
		copy(tg[b*T:(b+1)*T], l.buf[1:])
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

// read reads window w into l.buf and checks its ids against the vocabulary
// (unless NewLoader checked them all).
func (l *Loader) read(w int) error {
	pos := int64(w) * int64(l.cfg.Seq)
	if err := l.ds.Read(l.buf, pos); err != nil {
		return err
	}
	if l.checked {
		return nil
	}
	return l.checkVocab(l.buf, pos)
}
