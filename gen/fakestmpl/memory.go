//go:build memgentmpl

package fakes

// Host memory behind fake handles is materialised on first write, so that
// reserving or allocating terabytes costs nothing until written, and
// unwritten bytes read as zeros. An object up to denseLimit bytes gets one
// slice at its first write; a larger one gets pageSize pages as they are
// written.
const (
	denseLimit = 64 << 20
	pageSize   = 64 << 10
)

// store is the host memory of one physical object (an allocation, a
// committed chunk, a backing).
type store struct {
	size  uint64
	dense []byte            // size <= denseLimit, once written
	pages map[uint64][]byte // size > denseLimit
}

func newStore(size uint64) *store { return &store{size: size} }

// read copies the bytes at off into p. The caller has checked bounds.
func (s *store) read(off uint64, p []byte) {
	if s.size <= denseLimit {
		if s.dense == nil {
			clear(p)
		} else {
			copy(p, s.dense[off:])
		}
		return
	}
	for len(p) > 0 {
		pg, in := off/pageSize, off%pageSize
		n := min(uint64(len(p)), pageSize-in)
		if b := s.pages[pg]; b != nil {
			copy(p[:n], b[in:in+n])
		} else {
			clear(p[:n])
		}
		p, off = p[n:], off+n
	}
}

// write copies p into the store at off. The caller has checked bounds.
func (s *store) write(off uint64, p []byte) {
	if s.size <= denseLimit {
		if s.dense == nil {
			s.dense = make([]byte, s.size)
		}
		copy(s.dense[off:], p)
		return
	}
	for len(p) > 0 {
		pg, in := off/pageSize, off%pageSize
		n := min(uint64(len(p)), pageSize-in)
		b := s.pages[pg]
		if b == nil {
			if s.pages == nil {
				s.pages = make(map[uint64][]byte)
			}
			b = make([]byte, pageSize)
			s.pages[pg] = b
		}
		copy(b[in:in+n], p[:n])
		p, off = p[n:], off+n
	}
}

// clone returns a private copy of s.
func (s *store) clone() *store {
	c := &store{size: s.size}
	if s.dense != nil {
		c.dense = append([]byte(nil), s.dense...)
	}
	if len(s.pages) > 0 {
		c.pages = make(map[uint64][]byte, len(s.pages))
		for k, b := range s.pages {
			c.pages[k] = append([]byte(nil), b...)
		}
	}
	return c
}

// segment is the part of one copy that falls into one store.
type segment struct {
	st  *store
	off uint64
	n   uint64
}

// segments is a small reusable list of segments.
type segments []segment

func (ss segments) read(p []byte) {
	for _, s := range ss {
		s.st.read(s.off, p[:s.n])
		p = p[s.n:]
	}
}

func (ss segments) write(p []byte) {
	for _, s := range ss {
		s.st.write(s.off, p[:s.n])
		p = p[s.n:]
	}
}
