package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// expired reports whether err is the end of a context.
func expired(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

func since(start time.Time) time.Duration { return time.Since(start).Round(time.Millisecond) }

// errorf prefixes an error of this client's rank.
func (c *Client) errorf(format string, args ...any) error {
	return fmt.Errorf("rendezvous: rank %d: "+format, append([]any{c.rank}, args...)...)
}

// Set stores value under key, replacing any earlier value, and wakes the
// ranks waiting for key. The value may be empty and at most MaxValueSize
// bytes.
func (c *Client) Set(ctx context.Context, key string, value []byte) error {
	if err := c.set(ctx, key, value); err != nil {
		return c.errorf("%w", err)
	}
	return nil
}

func (c *Client) set(ctx context.Context, key string, value []byte) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("set %q: %w", key, err)
	}
	if len(value) > MaxValueSize {
		return fmt.Errorf("set %q: value of %d bytes exceeds the limit of %d", key, len(value), MaxValueSize)
	}
	ctx, cancel := withTimeout(ctx, c.timeout)
	defer cancel()
	if value == nil {
		value = []byte{}
	}
	if _, err := c.call(ctx, opSet, []byte(key), value); err != nil {
		return fmt.Errorf("set %q: %w", key, err)
	}
	return nil
}

// Get returns the value under key, waiting until some rank sets it or ctx
// ends; the error then names the key and how long it waited.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	v, err := c.get(ctx, key)
	if err != nil {
		return nil, c.errorf("%w", err)
	}
	return v, nil
}

func (c *Client) get(ctx context.Context, key string) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("get %q: %w", key, err)
	}
	ctx, cancel := withTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	fields, err := c.call(ctx, opGet, []byte(key))
	switch {
	case expired(err):
		return nil, fmt.Errorf("get %q: the key was not set within %v (store %s): %w", key, since(start), c.addr, err)
	case err != nil:
		return nil, fmt.Errorf("get %q: %w", key, err)
	case len(fields) != 1:
		return nil, fmt.Errorf("get %q: malformed answer with %d fields", key, len(fields))
	}
	return fields[0], nil
}

// Wait blocks until every key is set or ctx ends; the error then lists the
// keys still missing.
func (c *Client) Wait(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	fields := make([][]byte, len(keys))
	for i, k := range keys {
		if err := checkKey(k); err != nil {
			return c.errorf("wait for %q: %w", k, err)
		}
		fields[i] = []byte(k)
	}
	ctx, cancel := withTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	_, err := c.call(ctx, opWait, fields...)
	switch {
	case expired(err):
		return c.errorf("wait for %d keys: %s not set within %v (store %s): %w",
			len(keys), c.describeMissing(fields), since(start), c.addr, err)
	case err != nil:
		return c.errorf("wait for %q: %w", keys, err)
	}
	return nil
}

// describeMissing asks the store, briefly, which of keys are still unset.
func (c *Client) describeMissing(keys [][]byte) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	missing, err := c.call(ctx, opCheck, keys...)
	if err != nil {
		return fmt.Sprintf("some of %q (the store could not say which: %v)", keys, err)
	}
	return fmt.Sprintf("%q", missing)
}

// Add adds delta to the counter under key (0 when unset) atomically and
// returns the new value. The counter is stored as a decimal string, so Get
// reads it as text; Add on a key holding anything else fails.
func (c *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	v, err := c.add(ctx, key, delta)
	if err != nil {
		return 0, c.errorf("%w", err)
	}
	return v, nil
}

func (c *Client) add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, fmt.Errorf("add to %q: %w", key, err)
	}
	ctx, cancel := withTimeout(ctx, c.timeout)
	defer cancel()
	fields, err := c.call(ctx, opAdd, []byte(key), int64Field(delta))
	if err == nil && len(fields) != 1 {
		err = fmt.Errorf("malformed answer with %d fields", len(fields))
	}
	var v int64
	if err == nil {
		v, err = parseInt64Field(fields[0])
	}
	if err != nil {
		return 0, fmt.Errorf("add %d to %q: %w", delta, key, err)
	}
	return v, nil
}

// Barrier returns once n calls of Barrier with this name (from any ranks)
// have arrived. It may be reused: the k-th n arrivals release the k-th
// generation. At ctx's end the error says how many of the n had arrived.
func (c *Client) Barrier(ctx context.Context, name string, n int) error {
	if n < 1 {
		return c.errorf("barrier %q: %d participants, want at least 1", name, n)
	}
	ctx, cancel := withTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	counter := "barrier/" + name + "/count"
	count, err := c.add(ctx, counter, 1)
	if err != nil {
		return c.errorf("barrier %q: %w", name, err)
	}
	gen := (count - 1) / int64(n)
	release := fmt.Sprintf("barrier/%s/released/%d", name, gen)
	if count%int64(n) == 0 {
		if err := c.set(ctx, release, nil); err != nil {
			return c.errorf("barrier %q: %w", name, err)
		}
	}
	_, err = c.call(ctx, opWait, []byte(release))
	switch {
	case expired(err):
		arrived := "an unknown number"
		peek, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if now, perr := c.add(peek, counter, 0); perr == nil {
			arrived = fmt.Sprint(min(max(now-gen*int64(n), 0), int64(n)))
		}
		return c.errorf("barrier %q: %s of %d ranks arrived within %v (store %s): %w",
			name, arrived, n, since(start), c.addr, err)
	case err != nil:
		return c.errorf("barrier %q: %w", name, err)
	}
	return nil
}

// BroadcastBytes shares value from rank root with every rank that calls it
// with the same key: root stores value and returns it, the others wait for it
// and return what root stored. Use a fresh key per broadcast (a key keeps its
// value, so a reused key returns the old one to a rank that comes late).
func (c *Client) BroadcastBytes(ctx context.Context, key string, rank, root int, value []byte) ([]byte, error) {
	if root < 0 {
		return nil, c.errorf("broadcast %q: root rank %d is negative", key, root)
	}
	if rank == root {
		if err := c.set(ctx, key, value); err != nil {
			return nil, c.errorf("broadcast from root rank %d: %w", root, err)
		}
		return value, nil
	}
	v, err := c.get(ctx, key)
	if err != nil {
		return nil, c.errorf("broadcast from root rank %d: %w", root, err)
	}
	return v, nil
}
