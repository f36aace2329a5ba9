package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// h2Conn is a minimal gRPC client: bidirectional streams of already-encoded messages over one
// HTTP/2 connection, framed as gRPC specifies (PROTOCOL-HTTP2.md: HEADERS with :path and
// content-type application/grpc, then length-prefixed messages in DATA frames), with HTTP/2 flow
// control in both directions. It exists so that one process can stand in for 10,000 agents on a
// fraction of a core: grpc-go's client spends three goroutine hand-offs per message, which is fine
// for one agent per machine but made the load generator, not the coordinator, the bottleneck of
// this benchmark. The coordinator sees what a grpc-go agent sends: one DATA frame per message,
// written by its own write(2), never coalesced with other streams' messages.
type h2Conn struct {
	conn net.Conn
	bw   *bufio.Writer
	fr   *http2.Framer

	mu        sync.Mutex // serializes frame writes and guards what follows
	cond      *sync.Cond // broadcast when a send window grows, a stream ends or the connection fails
	hbuf      bytes.Buffer
	henc      *hpack.Encoder
	authority string
	nextID    uint32
	sendConn  int64 // bytes the server lets us send on the connection
	initWin   int64 // the server's SETTINGS_INITIAL_WINDOW_SIZE
	streams   map[uint32]*h2Stream
	recvConn  int64 // DATA bytes received and not yet returned with a WINDOW_UPDATE
	err       error
}

// h2Stream is one stream of an h2Conn.
type h2Stream struct {
	id       uint32
	sendWin  int64
	recvData int64         // received and not yet returned with a WINDOW_UPDATE
	received int64         // payload bytes received in all
	answered chan struct{} // closed when the first response message arrives
	answer   sync.Once
	err      error // set when the stream has ended; nil until then
}

// Windows the load generator grants the server. Responses (acks) are small and rare.
const (
	h2RecvWindow    = 65535   // per stream: the HTTP/2 default
	h2RecvConnExtra = 1 << 20 // added to the connection's default window
	h2UpdateAt      = 16 << 10
)

// dialH2 connects and exchanges the HTTP/2 prefaces; the connection is served until Close or failure.
func dialH2(ctx context.Context, addr string) (*h2Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &h2Conn{conn: conn, bw: bufio.NewWriterSize(conn, 16<<10), authority: addr, nextID: 1,
		sendConn: 65535, initWin: 65535, streams: map[uint32]*h2Stream{}}
	c.cond = sync.NewCond(&c.mu)
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.fr = http2.NewFramer(c.bw, bufio.NewReaderSize(conn, 16<<10))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.mu.Lock()
	_, err = c.bw.WriteString(http2.ClientPreface)
	if err == nil {
		err = c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2RecvWindow})
	}
	if err == nil {
		err = c.fr.WriteWindowUpdate(0, h2RecvConnExtra)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	c.mu.Unlock()
	if err != nil {
		conn.Close()
		return nil, err
	}
	go c.read()
	return c, nil
}

// Close closes the connection; every stream ends.
func (c *h2Conn) Close() error {
	c.fail(net.ErrClosed)
	return c.conn.Close()
}

// fail ends the connection with err (the first error wins). The caller must not hold c.mu.
func (c *h2Conn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		for _, s := range c.streams {
			c.end(s, err)
		}
	}
	c.cond.Broadcast()
}

// end ends one stream. c.mu must be held.
func (c *h2Conn) end(s *h2Stream, err error) {
	if s.err == nil {
		s.err = err
	}
	delete(c.streams, s.id)
	s.answer.Do(func() { close(s.answered) })
	c.cond.Broadcast()
}

// open starts a gRPC call of method (e.g. "/pkg.Service/Method").
func (c *h2Conn) open(method string) (*h2Stream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	s := &h2Stream{id: c.nextID, sendWin: c.initWin, answered: make(chan struct{})}
	c.nextID += 2
	c.hbuf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", c.authority},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"user-agent", "nodefence-bench-ingest"}} {
		if err := c.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			return nil, err
		}
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
		return nil, err
	}
	if err := c.bw.Flush(); err != nil {
		return nil, err
	}
	c.streams[s.id] = s
	return s, nil
}

// send writes one gRPC message, prefix included (appendMessage). It waits
// for flow-control window, and returns once the message is handed to the kernel.
func (c *h2Conn) send(s *h2Stream, msg []byte) error {
	n := int64(len(msg))
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.err == nil && s.err == nil && (c.sendConn < n || s.sendWin < n) {
		c.cond.Wait()
	}
	if c.err != nil {
		return c.err
	}
	if s.err != nil {
		return s.err
	}
	c.sendConn -= n
	s.sendWin -= n
	if err := c.fr.WriteData(s.id, false, msg); err != nil {
		return err
	}
	return c.bw.Flush()
}

// closeSend half-closes the stream (END_STREAM on an empty DATA frame).
func (c *h2Conn) closeSend(s *h2Stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	if err := c.fr.WriteData(s.id, true, nil); err != nil {
		return err
	}
	return c.bw.Flush()
}

// read serves the connection: settings, pings, window updates, responses (counted and dropped:
// the load generator needs only to know a stream was answered) and stream ends.
func (c *h2Conn) read() {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.fail(err)
			return
		}
		if err := c.handle(f); err != nil {
			c.fail(err)
			c.conn.Close()
			return
		}
	}
}

func (c *h2Conn) handle(f http2.Frame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
			delta := int64(v) - c.initWin
			c.initWin = int64(v)
			for _, s := range c.streams {
				s.sendWin += delta
			}
			c.cond.Broadcast()
		}
		if err := c.fr.WriteSettingsAck(); err != nil {
			return err
		}
		return c.bw.Flush()
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			c.sendConn += int64(f.Increment)
		} else if s := c.streams[f.StreamID]; s != nil {
			s.sendWin += int64(f.Increment)
		}
		c.cond.Broadcast()
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		if err := c.fr.WritePing(true, f.Data); err != nil {
			return err
		}
		return c.bw.Flush()
	case *http2.DataFrame:
		return c.data(f)
	case *http2.MetaHeadersFrame:
		s := c.streams[f.StreamID]
		if s == nil || !f.StreamEnded() {
			return nil // response headers
		}
		// Trailers (or a trailers-only response): the call is over.
		if code := f.PseudoValue("status"); code != "" && code != "200" {
			c.end(s, fmt.Errorf("stream %d: HTTP status %s", s.id, code))
		} else if st := headerValue(f, "grpc-status"); st != "0" {
			c.end(s, fmt.Errorf("stream %d: grpc-status %s: %s", s.id, st, headerValue(f, "grpc-message")))
		} else {
			c.end(s, io.EOF)
		}
	case *http2.RSTStreamFrame:
		if s := c.streams[f.StreamID]; s != nil {
			c.end(s, fmt.Errorf("stream %d reset: %v", s.id, f.ErrCode))
		}
	case *http2.GoAwayFrame:
		return fmt.Errorf("server sent GOAWAY: %v %s", f.ErrCode, f.DebugData())
	}
	return nil
}

// data takes a DATA frame: it returns flow-control credit and ends the stream on END_STREAM.
// c.mu is held.
func (c *h2Conn) data(f *http2.DataFrame) error {
	n := int64(f.Length)
	c.recvConn += n
	if c.recvConn >= h2UpdateAt {
		if err := c.fr.WriteWindowUpdate(0, uint32(c.recvConn)); err != nil {
			return err
		}
		c.recvConn = 0
	}
	if s := c.streams[f.StreamID]; s != nil {
		s.answer.Do(func() { close(s.answered) })
		s.recvData += n
		s.received += int64(len(f.Data()))
		if s.recvData >= h2UpdateAt && !f.StreamEnded() {
			if err := c.fr.WriteWindowUpdate(s.id, uint32(s.recvData)); err != nil {
				return err
			}
			s.recvData = 0
		}
		if f.StreamEnded() {
			c.end(s, io.EOF)
		}
	}
	return c.bw.Flush()
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.RegularFields() {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

// appendMessage appends m to b as one gRPC message: a 5-byte prefix (not compressed, length) and
// the encoded message.
func appendMessage(b []byte, m proto.Message) ([]byte, error) {
	start := len(b)
	b, err := proto.MarshalOptions{}.MarshalAppend(append(b, 0, 0, 0, 0, 0), m)
	if err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint32(b[start+1:start+5], uint32(len(b)-start-5))
	return b, nil
}

// streamErr is why s ended: nil while it runs.
func (c *h2Conn) streamErr(s *h2Stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.err == io.EOF {
		return errors.New("the server ended the stream")
	}
	return s.err
}

// receivedBytes is how many response bytes (gRPC prefixes included) s has received.
func (c *h2Conn) receivedBytes(s *h2Stream) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return s.received
}
