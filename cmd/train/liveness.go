package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/asynctp/asynctp/comm/rendezvous"
)

// peerWatch gives process ranks over a transport that does not notice a
// lost peer by itself (comm/nvshmem: its kernels wait for a dead peer until
// the op deadline, and it cannot abort) a way to learn of it through the
// store: each rank bumps a heartbeat counter every interval and reads the
// others'; a peer whose counter stops for lost is gone. A rank that fails on
// its own sets an abort key, which every rank waits on. Either way, or when
// the store itself goes away, onLost is called once with an error naming
// the rank.
type peerWatch struct {
	store          *rendezvous.Client
	rank, size     int
	interval, lost time.Duration
	onLost         func(error)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

const (
	watchPrefix = "asynctp/train/live"
	doneMark    = int64(1) << 40 // added to a heartbeat by a rank that finished cleanly
)

func watchPeers(store *rendezvous.Client, rank, size int, interval, lost time.Duration, onLost func(error)) *peerWatch {
	w := &peerWatch{store: store, rank: rank, size: size, interval: interval, lost: lost, onLost: onLost}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	w.wg.Add(2)
	go w.beat()
	go w.watchAbort()
	return w
}

func hbKey(rank int) string { return watchPrefix + "/hb/" + strconv.Itoa(rank) }

const abortKey = watchPrefix + "/abort"

func (w *peerWatch) lose(err error) {
	if w.ctx.Err() != nil {
		return // closing
	}
	w.once.Do(func() { w.onLost(err) })
}

func (w *peerWatch) add(key string, delta int64) (int64, error) {
	ctx, cancel := context.WithTimeout(w.ctx, max(4*w.interval, 5*time.Second))
	defer cancel()
	return w.store.Add(ctx, key, delta)
}

func (w *peerWatch) beat() {
	defer w.wg.Done()
	last := make([]int64, w.size)
	changed := make([]time.Time, w.size)
	start := time.Now()
	for q := range changed {
		changed[q] = start
	}
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		_, err := w.add(hbKey(w.rank), 1)
		for q := 0; q < w.size && err == nil; q++ {
			if q == w.rank {
				continue
			}
			var v int64
			if v, err = w.add(hbKey(q), 0); err != nil {
				break
			}
			now := time.Now()
			switch {
			case v >= doneMark: // finished cleanly
				changed[q] = now
			case v != last[q]:
				last[q], changed[q] = v, now
			case now.Sub(changed[q]) > w.lost:
				w.lose(fmt.Errorf("world rank %d sent no heartbeat for %v (its process exited, crashed, was killed or hangs)",
					q, now.Sub(changed[q]).Round(time.Millisecond)))
			}
		}
		if errors.Is(err, rendezvous.ErrConnectionLost) {
			w.lose(fmt.Errorf("the store is gone (rank 0 hosts it unless --nproc's launcher does: rank 0 or the launcher died): %w", err))
			return
		}
		select {
		case <-w.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// watchAbort waits for the abort key.
func (w *peerWatch) watchAbort() {
	defer w.wg.Done()
	for w.ctx.Err() == nil {
		v, err := w.store.Get(w.ctx, abortKey)
		switch {
		case err == nil:
			from, msg, _ := strings.Cut(string(v), ":")
			if from != strconv.Itoa(w.rank) {
				w.lose(fmt.Errorf("world rank %s failed: %s", from, msg))
			}
			return
		case errors.Is(err, rendezvous.ErrConnectionLost):
			return // beat says so
		case w.ctx.Err() == nil:
			time.Sleep(w.interval) // the store's call timeout: wait again
		}
	}
}

// tell sets the abort key: this rank failed with err.
func (w *peerWatch) tell(err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	w.store.Set(ctx, abortKey, []byte(strconv.Itoa(w.rank)+":"+err.Error()))
}

// close stops watching; clean marks this rank as finished, so that the
// others do not take its silence for a death.
func (w *peerWatch) close(clean bool) {
	if clean {
		w.add(hbKey(w.rank), doneMark)
	}
	w.cancel()
	w.wg.Wait()
}
