// Package corpus makes the default training text of cmd/train: a few hundred
// kilobytes of simple English generated from a small grammar with a fixed
// seed. It is generated rather than shipped so that the repository carries no
// third-party text, and it is regular enough that a tiny byte-level model
// shows its loss falling within a couple of minutes on a laptop CPU.
package corpus
