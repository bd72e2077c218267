package cuda

/*
#include "atp_cuda.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
)

// Context is a device's primary context: the one context per device that
// the CUDA runtime, cuBLASLt, NCCL and NVSHMEM also use, so memory and
// streams made here are valid in those libraries too.
//
// CUDA keeps the current context per OS thread, while Go moves goroutines
// between threads. A goroutine that makes CUDA calls must therefore be
// locked to its thread (runtime.LockOSThread) and bind the context on that
// thread (Bind) before its first call. OnDevice and Worker do both.
type Context struct {
	dev Device
	h   C.CUcontext
}

var primaries struct {
	mu   sync.Mutex
	ctxs map[int]*Context
}

// PrimaryContext retains the device's primary context
// (cuDevicePrimaryCtxRetain). It is retained once per process and kept for
// the life of the process, as the CUDA runtime does; every call returns the
// same *Context.
func (d Device) PrimaryContext() (*Context, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	primaries.mu.Lock()
	defer primaries.mu.Unlock()
	if c, ok := primaries.ctxs[d.ordinal]; ok {
		return c, nil
	}
	var h C.CUcontext
	if r := Result(C.atp_cuDevicePrimaryCtxRetain(&h, d.h)); r != Success {
		return nil, fail(r, "cuDevicePrimaryCtxRetain(%v)", d)
	}
	c := &Context{dev: d, h: h}
	if primaries.ctxs == nil {
		primaries.ctxs = make(map[int]*Context)
	}
	primaries.ctxs[d.ordinal] = c
	return c, nil
}

// Device is the context's device.
func (c *Context) Device() Device { return c.dev }

// Handle is the CUcontext, for other libraries.
func (c *Context) Handle() uintptr { return uintptr(c.h) }

// Bind makes the context current on the calling OS thread
// (cuCtxSetCurrent). The calling goroutine must already be locked to its
// thread with runtime.LockOSThread, and stay locked while it uses CUDA;
// otherwise the Go scheduler may move it to a thread where the context is not
// current, and calls fail with CUDA_ERROR_INVALID_CONTEXT (or, worse, run in
// another device's context).
func (c *Context) Bind() error {
	if r := Result(C.atp_cuCtxSetCurrent(c.h)); r != Success {
		return fail(r, "cuCtxSetCurrent(%v)", c.dev)
	}
	return nil
}

// Synchronize waits for all work of the context (cuCtxSynchronize). The
// context must be current on the calling thread.
func (c *Context) Synchronize() error {
	if r := Result(C.atp_cuCtxSynchronize()); r != Success {
		return fail(r, "cuCtxSynchronize on %v", c.dev)
	}
	return nil
}

// OnDevice runs fn on the calling goroutine with the goroutine locked to its
// OS thread and the primary context of device ordinal current on it, then
// unlocks the goroutine (the context stays current on that thread, which is
// harmless). It suits tests, tools and setup code; a long-lived GPU owner
// should use a Worker or lock its own goroutine and call Bind.
func OnDevice(ordinal int, fn func(*Context) error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, err := GetDevice(ordinal)
	if err != nil {
		return err
	}
	c, err := d.PrimaryContext()
	if err != nil {
		return err
	}
	if err := c.Bind(); err != nil {
		return err
	}
	return fn(c)
}

// Worker is a goroutine that owns one device: it is locked to its OS thread
// with the device's primary context bound, and runs the functions given to
// Do one at a time, in order. It is the project's "one GPU-owning goroutine
// per device".
type Worker struct {
	ctx  *Context
	jobs chan job
	done chan struct{}
	once sync.Once
}

type job struct {
	fn  func(*Context) error
	err chan error
}

// ErrWorkerClosed is returned by Do after Close.
var ErrWorkerClosed = errors.New("cuda: worker is closed")

// NewWorker starts a worker for device ordinal.
func NewWorker(ordinal int) (*Worker, error) {
	w := &Worker{jobs: make(chan job), done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Stays locked until the goroutine ends, so the thread, with
		// its context binding, exits with it.
		runtime.LockOSThread()
		err := func() error {
			d, err := GetDevice(ordinal)
			if err != nil {
				return err
			}
			if w.ctx, err = d.PrimaryContext(); err != nil {
				return err
			}
			return w.ctx.Bind()
		}()
		started <- err
		if err != nil {
			return
		}
		defer close(w.done)
		for j := range w.jobs {
			j.err <- runJob(w.ctx, j.fn)
		}
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("cuda: starting worker for cuda:%d: %w", ordinal, err)
	}
	return w, nil
}

// runJob runs fn, turning a panic into an error so one bad job does not kill
// the worker with its thread.
func runJob(c *Context, fn func(*Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("cuda: panic in worker job on %v: %v", c.dev, p)
		}
	}()
	return fn(c)
}

// Context is the worker's context.
func (w *Worker) Context() *Context { return w.ctx }

// Do runs fn on the worker's thread and returns its error. Calls from
// several goroutines are serialised.
func (w *Worker) Do(fn func(*Context) error) (err error) {
	defer func() {
		// Sending on the closed jobs channel panics: report it.
		if recover() != nil {
			err = ErrWorkerClosed
		}
	}()
	j := job{fn: fn, err: make(chan error, 1)}
	w.jobs <- j
	return <-j.err
}

// Close stops the worker after the job in progress; Do then returns
// ErrWorkerClosed. It waits for the worker goroutine to end.
func (w *Worker) Close() {
	w.once.Do(func() { close(w.jobs) })
	<-w.done
}
