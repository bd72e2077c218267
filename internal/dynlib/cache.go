package dynlib

import "sync"

// Cache keeps the first library that loads for the life of the process, and
// remembers the failures by path. The zero Cache is empty.
type Cache[L any] struct {
	mu   sync.Mutex
	lib  *L               // the installed library, once one loaded
	errs map[string]error // failures, by path
}

// Load returns the library kept, if one loaded. Otherwise it asks find for
// the path to load (and whether the environment named it), returns the
// failure remembered for that path, if any, or else installs it: what
// install returns is kept, or its error remembered for the path. find and
// install run under the cache's lock.
func (c *Cache[L]) Load(find func() (path string, fromEnv bool, err error), install func(path string, fromEnv bool) (L, error)) (L, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var none L
	if c.lib != nil {
		return *c.lib, nil
	}
	path, fromEnv, err := find()
	if err != nil {
		return none, err
	}
	if err := c.errs[path]; err != nil {
		return none, err
	}
	lib, err := install(path, fromEnv)
	if err != nil {
		if c.errs == nil {
			c.errs = make(map[string]error)
		}
		c.errs[path] = err
		return none, err
	}
	c.lib = &lib
	return lib, nil
}

// Loaded reports whether a library loaded.
func (c *Cache[L]) Loaded() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lib != nil
}
