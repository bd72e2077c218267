package tp

import (
	"errors"
	"fmt"
	"io"
)

// Closing the layers: each communication site a layer built through the
// chooser holds what its strategy allocated (side streams, events,
// symmetric buffers, a dispatch engine), released by its Close. A layer's
// Close closes the sites it owns, once: a second Close releases nothing
// and returns nil, and Forward and Backward then refuse. Freeing
// symmetric memory is collective (every rank of the group frees the same
// buffers in the same order), so every rank closes the same layers in the
// same order, and a layer closes its sites in the order it built them
// (below); a failed site does not stop the others from closing.

var errClosed = errors.New("the layer is closed (Close)")

// closeSite closes one site once, naming it in the error.
func closeSite(what, site string, c io.Closer) error {
	if c == nil {
		return nil
	}
	if err := c.Close(); err != nil {
		return fmt.Errorf("%s: closing its %s site: %w", what, site, err)
	}
	return nil
}

// close releases the entry's site.
func (e *entry) close() error {
	if e == nil || e.closed {
		return nil
	}
	e.closed, e.n = true, 0
	var c io.Closer
	if e.agmm != nil {
		c = e.agmm
	} else if e.mmar != nil {
		c = e.mmar
	}
	e.agmm, e.mmar = nil, nil
	return closeSite(e.what, "entry", c)
}

// Close releases the layer's entry site (a column-parallel part of
// attention or an MLP has none: the layer closes the shared one). Every
// rank of the TP group closes it.
func (l *ColumnParallelLinear) Close() error { return l.e.close() }

// Close releases the layer's exit site. Every rank of the TP group closes
// it.
func (l *RowParallelLinear) Close() error {
	if l.closed {
		return nil
	}
	l.closed, l.n = true, 0
	var c io.Closer
	if l.mmrs != nil {
		c = l.mmrs
	} else if l.mmar != nil {
		c = l.mmar
	}
	l.mmrs, l.mmar = nil, nil
	return closeSite(l.what(), "exit", c)
}

// Close releases the layer's sites, in the order it built them: wo's exit
// site, then the q/k/v entry. Every rank of the TP group closes it.
func (a *Attention) Close() error {
	a.bt = [2]int{}
	return errors.Join(a.Wo.Close(), a.e.close())
}

// Close releases the layer's sites, in the order it built them: w_down's
// exit site, then the gate/up entry. Every rank of the TP group closes it.
func (m *MLP) Close() error {
	m.n = 0
	return errors.Join(m.Down.Close(), m.e.close())
}

// Close releases the block's sites: the attention's, then the
// feed-forward layer's (the MLP's, or, for NewBlockWith's layer, its Close
// when it has one: an io.Closer). Every rank closes it, after the device
// work that uses the sites (the caller's Sync on a GPU).
func (blk *Block) Close() error {
	var errs []error
	if blk.Attn != nil {
		errs = append(errs, blk.Attn.Close())
	}
	if c, ok := blk.ffn.(io.Closer); ok {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
