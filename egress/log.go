package egress

import "sync"

// MaxRecords caps the records a Log holds between two Takes; the rest are
// counted.
const MaxRecords = 1000

// Log gathers a sandbox's connection records as the network helper reports
// them, for the run or session call that takes them. A connection's
// records (open, then closed with its final bytes) merge into one under
// its ID; one still open when taken is returned again once it closes. The
// zero Log is ready; it is safe for concurrent use.
type Log struct {
	mu      sync.Mutex
	records []Connection
	index   map[uint64]int        // ID → position in records
	taken   map[uint64]Connection // taken while open: completes its close
	dropped int
	lost    map[uint64]bool // IDs dropped since the last Take
}

// Add records c, merging it into the record with its ID if there is one
// since the last Take.
func (l *Log) Add(c Connection) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.index == nil {
		l.index = map[uint64]int{}
		l.taken = map[uint64]Connection{}
		l.lost = map[uint64]bool{}
	}
	if i, ok := l.index[c.ID]; ok {
		l.records[i] = merge(l.records[i], c)
		return
	}
	if l.lost[c.ID] {
		return // counted once already
	}
	if len(l.records) >= MaxRecords {
		l.dropped++
		l.lost[c.ID] = true
		return
	}
	if prev, ok := l.taken[c.ID]; ok {
		c = merge(prev, c)
		if !c.Open {
			delete(l.taken, c.ID)
		}
	}
	l.index[c.ID] = len(l.records)
	l.records = append(l.records, c)
}

// merge is the newer record of a connection, keeping what the older one
// said and the newer leaves out.
func merge(old, c Connection) Connection {
	if c.Name == "" {
		c.Name = old.Name
	}
	if c.Port == 0 {
		c.Port = old.Port
	}
	if c.Addr == "" {
		c.Addr = old.Addr
	}
	if c.Kind == "" {
		c.Kind = old.Kind
	}
	if c.Decision == "" {
		c.Decision = old.Decision
	}
	if c.Reason == "" {
		c.Reason = old.Reason
	}
	c.BytesOut = max(c.BytesOut, old.BytesOut)
	c.BytesIn = max(c.BytesIn, old.BytesIn)
	return c
}

// Take returns the records added since the last Take, in the order first
// added, and how many were dropped beyond MaxRecords.
func (l *Log) Take() (records []Connection, dropped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	records, dropped = l.records, l.dropped
	for _, c := range records {
		if _, had := l.taken[c.ID]; c.Open && (had || len(l.taken) < MaxRecords) {
			l.taken[c.ID] = c
		} else if !c.Open {
			delete(l.taken, c.ID)
		}
	}
	l.records, l.dropped = nil, 0
	clear(l.index)
	clear(l.lost)
	return records, dropped
}
