//lint:file-ignore U1000 the _msgpack fields carry msgpack's as_array struct tag

package wire

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"
)

// The transport benchmarks compare the wire protocol (QUIC + TLS +
// msgpack framing) with bare UDP and TCP echoes over loopback, measured in
// the same run: `make bench` runs
//
//	go test -run '^$' -bench 'RoundTrip16KB|Throughput4MB' -benchtime 3000x ./wire/
//
// RoundTrip16KB reports the p50 and p99 of one request/response of a
// 16 KiB payload (a Mixtral hidden state in float32); Throughput4MB sends
// 4 MiB messages one way, each acknowledged. "x-udp" metrics are the
// ratio to the bare UDP figure of the same run.

const (
	rtPayload   = 16 << 10
	bulkPayload = 4 << 20
)

// reference figures of the current run, for the ratios
var udpRoundTrip, udpMTURoundTrip struct{ p50, p99 time.Duration }
var udpThroughput, udpMTUThroughput float64 // bytes/s

func benchConfigs(b *testing.B) (server, client *Config) {
	server = testConfig(b, "bench", "w1")
	client = testConfig(b, "bench", "main")
	server.Log, client.Log = zerolog.Nop(), zerolog.Nop()
	return server, client
}

func reportLatency(b *testing.B, lat []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(lat)
	p50, p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	b.ReportMetric(float64(p50.Nanoseconds())/1e3, "p50-us")
	b.ReportMetric(float64(p99.Nanoseconds())/1e3, "p99-us")
	return p50, p99
}

func BenchmarkRoundTrip16KB(b *testing.B) {
	b.Run("udp", func(b *testing.B) {
		server, client := udpPair(b)
		go udpEcho(server)
		buf, in := make([]byte, rtPayload), make([]byte, 65536)
		lat := make([]time.Duration, b.N)
		b.SetBytes(2 * rtPayload)
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			if _, err := client.Write(buf); err != nil {
				b.Fatal(err)
			}
			client.SetReadDeadline(time.Now().Add(2 * time.Second))
			if n, err := client.Read(in); err != nil || n != rtPayload {
				b.Fatalf("udp echo: %d bytes, %v", n, err)
			}
			lat[i] = time.Since(start)
		}
		b.StopTimer()
		udpRoundTrip.p50, udpRoundTrip.p99 = reportLatency(b, lat)
	})
	b.Run("udp-1400", func(b *testing.B) {
		// The same 16 KiB as 12 datagrams of at most 1400 bytes, each
		// echoed: the packet count QUIC (and any Ethernet LAN) needs.
		server, client := udpPair(b)
		go udpEcho(server)
		const dgram = 1400
		buf, in := make([]byte, rtPayload), make([]byte, 65536)
		lat := make([]time.Duration, b.N)
		b.SetBytes(2 * rtPayload)
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			for off := 0; off < rtPayload; off += dgram {
				if _, err := client.Write(buf[off:min(off+dgram, rtPayload)]); err != nil {
					b.Fatal(err)
				}
			}
			client.SetReadDeadline(time.Now().Add(2 * time.Second))
			for got := 0; got < rtPayload; {
				n, err := client.Read(in)
				if err != nil {
					b.Fatalf("udp echo: %v", err)
				}
				got += n
			}
			lat[i] = time.Since(start)
		}
		b.StopTimer()
		p50, p99 := reportLatency(b, lat)
		ratio(b, p50, p99)
		udpMTURoundTrip.p50, udpMTURoundTrip.p99 = p50, p99
	})
	b.Run("tcp", func(b *testing.B) {
		server, client := tcpPair(b)
		go tcpEcho(server)
		frame := make([]byte, 4+rtPayload)
		binary.BigEndian.PutUint32(frame, rtPayload)
		lat := make([]time.Duration, b.N)
		b.SetBytes(2 * rtPayload)
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			if _, err := client.Write(frame); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(client, frame); err != nil {
				b.Fatal(err)
			}
			lat[i] = time.Since(start)
		}
		b.StopTimer()
		p50, p99 := reportLatency(b, lat)
		ratio(b, p50, p99)
	})
	b.Run("quic-stream", func(b *testing.B) {
		// quic-go alone (TLS 1.3, one bidirectional stream, no framing
		// or msgpack): what the wire protocol adds on top of QUIC.
		stream := quicStreamPair(b, func(s *quic.Stream) {
			buf := make([]byte, rtPayload)
			for {
				if _, err := io.ReadFull(s, buf); err != nil {
					return
				}
				if _, err := s.Write(buf); err != nil {
					return
				}
			}
		})
		frame := make([]byte, rtPayload)
		lat := make([]time.Duration, b.N)
		b.SetBytes(2 * rtPayload)
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			if _, err := stream.Write(frame); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(stream, frame); err != nil {
				b.Fatal(err)
			}
			lat[i] = time.Since(start)
		}
		b.StopTimer()
		p50, p99 := reportLatency(b, lat)
		ratio(b, p50, p99)
	})
	b.Run("wire", func(b *testing.B) {
		scfg, ccfg := benchConfigs(b)
		l := listen(b, scfg)
		client, server := connect(b, l, ccfg)
		ctx := context.Background()
		go func() { // the worker: answer every activation with a result
			for {
				m, err := server.Recv(ctx)
				if err != nil {
					return
				}
				a := m.(*Activation)
				if server.Send(ctx, &ExpertResult{Pass: a.Pass, Layer: a.Layer, Expert: int(a.Experts[0]), Output: a.Hidden}) != nil {
					return
				}
			}
		}()
		act := &Activation{Tokens: 1, Experts: []int32{3, 5}, Hidden: Float32Tensor(ramp(rtPayload/4), 1, rtPayload/4)}
		lat := make([]time.Duration, b.N)
		b.SetBytes(2 * rtPayload)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			act.Pass, act.Layer = int64(i), i%32
			if err := client.Send(ctx, act); err != nil {
				b.Fatal(err)
			}
			m, err := client.Recv(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if r := m.(*ExpertResult); r.Pass != int64(i) || len(r.Output.Data) != rtPayload {
				b.Fatalf("result %d: %+v", i, r)
			}
			lat[i] = time.Since(start)
		}
		b.StopTimer()
		p50, p99 := reportLatency(b, lat)
		ratio(b, p50, p99)
	})
}

// ratio reports p50 and p99 relative to the bare UDP echo of one 16 KiB
// datagram and, for QUIC, of twelve MTU-sized ones.
func ratio(b *testing.B, p50, p99 time.Duration) {
	if udpRoundTrip.p50 > 0 {
		b.ReportMetric(float64(p50)/float64(udpRoundTrip.p50), "x-udp-p50")
		b.ReportMetric(float64(p99)/float64(udpRoundTrip.p99), "x-udp-p99")
	}
	if udpMTURoundTrip.p50 > 0 && (strings.Contains(b.Name(), "quic") || strings.Contains(b.Name(), "wire")) {
		b.ReportMetric(float64(p50)/float64(udpMTURoundTrip.p50), "x-udp1400-p50")
	}
}

func BenchmarkThroughput4MB(b *testing.B) {
	b.Run("udp", func(b *testing.B) {
		udpThroughput = udpBlast(b, 60000)
	})
	b.Run("udp-1400", func(b *testing.B) {
		udpMTUThroughput = udpBlast(b, 1400)
		b.ReportMetric(udpMTUThroughput/udpThroughput, "x-udp")
	})
	b.Run("tcp", func(b *testing.B) {
		server, client := tcpPair(b)
		go func() {
			buf := make([]byte, bulkPayload)
			for {
				if _, err := io.ReadFull(server, buf); err != nil {
					return
				}
				server.Write(buf[:1])
			}
		}()
		msg, ack := make([]byte, bulkPayload), make([]byte, 1)
		b.SetBytes(bulkPayload)
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			if _, err := client.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(client, ack); err != nil {
				b.Fatal(err)
			}
		}
		throughputRatio(b, start)
	})
	b.Run("quic-stream", func(b *testing.B) {
		stream := quicStreamPair(b, func(s *quic.Stream) {
			buf := make([]byte, bulkPayload)
			for {
				if _, err := io.ReadFull(s, buf); err != nil {
					return
				}
				if _, err := s.Write(buf[:1]); err != nil {
					return
				}
			}
		})
		msg, ack := make([]byte, bulkPayload), make([]byte, 1)
		b.SetBytes(bulkPayload)
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			if _, err := stream.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(stream, ack); err != nil {
				b.Fatal(err)
			}
		}
		throughputRatio(b, start)
	})
	b.Run("wire", func(b *testing.B) {
		scfg, ccfg := benchConfigs(b)
		l := listen(b, scfg)
		client, server := connect(b, l, ccfg)
		ctx := context.Background()
		go func() {
			for {
				m, err := server.Recv(ctx)
				if err != nil {
					return
				}
				if server.Send(ctx, &Heartbeat{Seq: m.(*Alignment).Seq}) != nil {
					return
				}
			}
		}()
		chunk := bulk(0, make([]byte, bulkPayload))
		b.SetBytes(bulkPayload)
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for i := range b.N {
			chunk.Seq = uint64(i)
			if err := client.Send(ctx, chunk); err != nil {
				b.Fatal(err)
			}
			if _, err := client.Recv(ctx); err != nil {
				b.Fatal(err)
			}
		}
		throughputRatio(b, start)
	})
}

func throughputRatio(b *testing.B, start time.Time) {
	bps := float64(b.N) * bulkPayload / time.Since(start).Seconds()
	if udpThroughput > 0 {
		b.ReportMetric(bps/udpThroughput, "x-udp")
	}
	if udpMTUThroughput > 0 {
		b.ReportMetric(bps/udpMTUThroughput, "x-udp1400")
	}
}

// udpBlast sends 4 MiB messages as datagrams of dgram bytes, each
// message acknowledged by the receiver with the bytes it got (datagrams
// can be lost: the loss is reported, never waited for), and returns the
// bytes per second delivered.
func udpBlast(b *testing.B, dgram int) float64 {
	server, client := udpPair(b)
	go func() {
		buf, got := make([]byte, 65536), uint64(0)
		for {
			n, addr, err := server.ReadFromUDP(buf)
			if err != nil {
				return
			}
			got += uint64(n)
			if buf[0] == 1 { // the last datagram of a message
				server.WriteToUDP(binary.BigEndian.AppendUint64(nil, got), addr)
				got = 0
			}
		}
	}()
	msg, ack := make([]byte, bulkPayload), make([]byte, 16)
	var delivered uint64
	b.SetBytes(bulkPayload)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		for off := 0; off < bulkPayload; off += dgram {
			d := msg[off:min(off+dgram, bulkPayload)]
			d[0] = 0
			if off+dgram >= bulkPayload {
				d[0] = 1
			}
			if _, err := client.Write(d); err != nil {
				b.Fatal(err)
			}
		}
		client.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := client.Read(ack)
		if err != nil || n != 8 {
			b.Fatalf("udp: no acknowledgement (last datagram lost?): %v", err)
		}
		delivered += binary.BigEndian.Uint64(ack)
	}
	elapsed := time.Since(start).Seconds()
	b.StopTimer()
	b.ReportMetric(100*(1-float64(delivered)/float64(b.N*bulkPayload)), "lost-%")
	return float64(delivered) / elapsed
}

// BenchmarkTensorEncoding compares a 4 MiB float32 tensor as a msgpack
// array of floats with the same tensor as raw bytes in a Tensor, through
// the frame encoder and the message decoder the wire uses: "copy"
// decodes from a reused buffer (the control stream), "aliased" lets the
// tensor keep the frame's buffer (bulk streams).
func BenchmarkTensorEncoding(b *testing.B) {
	type floats struct {
		_msgpack struct{} `msgpack:",as_array"`
		Shape    []int
		Data     []float32
	}
	v := ramp(bulkPayload / 4)
	b.Run("msgpack-float32-array/encode", func(b *testing.B) {
		enc := newFrameEncoder(keepBulkBuf)
		in := &floats{Shape: []int{len(v)}, Data: v}
		b.SetBytes(bulkPayload)
		for range b.N {
			enc.buf = enc.buf[:0]
			if err := enc.enc.Encode(in); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(enc.buf)), "encoded-bytes")
	})
	b.Run("msgpack-float32-array/decode", func(b *testing.B) {
		encoded, err := msgpack.Marshal(&floats{Shape: []int{len(v)}, Data: v})
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(bulkPayload)
		for range b.N {
			var out floats
			if err := msgpack.Unmarshal(encoded, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
	act := &Activation{Tokens: 1, Hidden: Float32Tensor(v)}
	enc := newFrameEncoder(keepBulkBuf)
	b.Run("raw-bytes/encode", func(b *testing.B) {
		b.SetBytes(bulkPayload)
		var frame []byte
		for range b.N {
			var err error
			if frame, err = enc.encode(act, defaultMaxFrameBytes); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(frame)), "encoded-bytes")
	})
	frame, err := enc.encode(act, defaultMaxFrameBytes)
	if err != nil {
		b.Fatal(err)
	}
	body := slices.Clone(frame[frameHeaderLen:])
	for _, owned := range []bool{false, true} {
		name := "raw-bytes/decode-copy"
		if owned {
			name = "raw-bytes/decode-aliased"
		}
		b.Run(name, func(b *testing.B) {
			md := newMessageDecoder()
			b.SetBytes(bulkPayload)
			for range b.N {
				if _, err := md.decode(typeActivation, body, owned); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func udpPair(b *testing.B) (server, client *net.UDPConn) {
	server, err := listenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	client, err = net.DialUDP("udp4", nil, server.LocalAddr().(*net.UDPAddr))
	if err != nil {
		b.Fatal(err)
	}
	raiseUDPBuffers(client, wantUDPBuffer)
	b.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

func udpEcho(c *net.UDPConn) {
	buf := make([]byte, 65536)
	for {
		n, addr, err := c.ReadFromUDP(buf)
		if err != nil {
			return
		}
		c.WriteToUDP(buf[:n], addr)
	}
}

func tcpPair(b *testing.B) (server, client net.Conn) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

func tcpEcho(c net.Conn) {
	buf := make([]byte, 4+rtPayload)
	for {
		if _, err := io.ReadFull(c, buf[:4]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(buf)
		if _, err := io.ReadFull(c, buf[4:4+n]); err != nil {
			return
		}
		if _, err := c.Write(buf[:4+n]); err != nil {
			return
		}
	}
}

// quicStreamPair opens one bidirectional quic-go stream over loopback
// with the same TLS as the wire protocol, echoed by the server.
func quicStreamPair(b *testing.B, serve func(*quic.Stream)) *quic.Stream {
	scfg, ccfg := benchConfigs(b)
	scfg, _ = scfg.settled()
	ccfg, _ = ccfg.settled()
	stls, err := scfg.serverTLS(alpn)
	if err != nil {
		b.Fatal(err)
	}
	qconf := &quic.Config{MaxIdleTimeout: 5 * time.Second}
	ln, err := quic.ListenAddr("127.0.0.1:0", stls, qconf)
	if err != nil {
		b.Fatal(err)
	}
	var refused errBox
	ctls := ccfg.clientTLS(alpn, &refused)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := quic.DialAddr(ctx, ln.Addr().String(), ctls, qconf)
	if err != nil {
		b.Fatal(err)
	}
	sconn, err := ln.Accept(ctx)
	if err != nil {
		b.Fatal(err)
	}
	stream, err := conn.OpenStream()
	if err != nil {
		b.Fatal(err)
	}
	stream.Write([]byte{0}) // make the stream known to the server
	sstream, err := sconn.AcceptStream(ctx)
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		var first [1]byte
		if _, err := io.ReadFull(sstream, first[:]); err == nil {
			serve(sstream)
		}
	}()
	b.Cleanup(func() {
		conn.CloseWithError(0, "")
		sconn.CloseWithError(0, "")
		ln.Close()
	})
	return stream
}

// BenchmarkReadFrame reads bulk frames from memory through the frame
// reader: what reading a big body into pieces until half of it has come
// costs beside allocating it from its header (no network in the way).
func BenchmarkReadFrame(b *testing.B) {
	for _, size := range []int{64 << 10, 4 << 20, 64<<20 - 2} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			in := frame(uint32(size+2), ProtocolVersion, typeAlignment, make([]byte, size))
			r := bytes.NewReader(in)
			fr := &frameReader{r: r, maxBytes: defaultMaxFrameBytes}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(in)
				if _, _, _, err := fr.next(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
