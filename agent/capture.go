package agent

// Capture keeps the head and the tail of a stream within a fixed budget, so
// that a program printing gigabytes costs neither side more than Max bytes.
// The head holds the first Max-Max/2 bytes written, the tail the last Max/2
// bytes that followed. The zero Capture keeps nothing.
type Capture struct {
	// Max is the most bytes kept, head and tail together.
	Max int64

	head  []byte
	tail  []byte // holds up to 2×tailMax bytes; the kept tail is its end
	total int64
}

func (c *Capture) headMax() int64 { return max(0, c.Max-c.Max/2) }
func (c *Capture) tailMax() int64 { return max(0, c.Max/2) }

// Write records p. It never fails.
func (c *Capture) Write(p []byte) (int, error) {
	n := len(p)
	c.total += int64(n)
	if room := c.headMax() - int64(len(c.head)); room > 0 {
		k := min(room, int64(len(p)))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	tmax := c.tailMax()
	if len(p) == 0 || tmax == 0 {
		return n, nil
	}
	if int64(len(p)) >= tmax {
		c.tail = append(c.tail[:0], p[int64(len(p))-tmax:]...)
		return n, nil
	}
	if int64(len(c.tail)+len(p)) > 2*tmax {
		// Keep only what can still be part of the tail, then append.
		keep := c.tail[int64(len(c.tail))-(tmax-int64(len(p))):]
		c.tail = append(c.tail[:0], keep...)
	}
	c.tail = append(c.tail, p...)
	return n, nil
}

// Head returns the first bytes written, up to Max-Max/2 of them.
func (c *Capture) Head() []byte { return c.head }

// Tail returns the last bytes written after the head, up to Max/2 of them.
func (c *Capture) Tail() []byte {
	if t := c.tailMax(); int64(len(c.tail)) > t {
		return c.tail[int64(len(c.tail))-t:]
	}
	return c.tail
}

// Total is the number of bytes written.
func (c *Capture) Total() int64 { return c.total }

// Omitted is the number of bytes written that neither head nor tail kept.
func (c *Capture) Omitted() int64 { return c.total - int64(len(c.head)) - int64(len(c.Tail())) }
