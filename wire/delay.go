package wire

import (
	"net"
	"slices"
	"sync"
	"time"
)

// delayConn adds a fixed one-way delay to every datagram it sends: the
// emulated rig's link latency where the kernel has no netem (testbed/rig
// says so). Datagrams keep their order. It is a plain net.PacketConn on
// purpose: quic-go then writes through WriteTo (no GSO, no ECN), which is
// where the delay is applied.
type delayConn struct {
	conn  net.PacketConn
	delay time.Duration
	queue chan delayed
	done  chan struct{}
	once  sync.Once
	// flushed closes once the datagrams queued before Close are sent
	flushed chan struct{}
}

type delayed struct {
	b    []byte
	addr net.Addr
	due  time.Time
}

// delayQueue bounds datagrams in flight on one delayed socket (~12 MB
// of 1.5 KB datagrams); a full queue blocks the sender, as a full NIC
// queue would.
const delayQueue = 8192

func newDelayConn(conn net.PacketConn, delay time.Duration) *delayConn {
	d := &delayConn{conn: conn, delay: delay, queue: make(chan delayed, delayQueue), done: make(chan struct{}), flushed: make(chan struct{})}
	go d.send()
	return d
}

// send sends each datagram when due. Once closed, it still sends those
// already queued, as a link delivers what is on it: a node's last words
// (QUIC's CONNECTION_CLOSE) reach its peers, which would otherwise wait
// for their idle timeout.
func (d *delayConn) send() {
	defer close(d.flushed)
	for {
		select {
		case p := <-d.queue:
			d.deliver(p)
		case <-d.done:
			for {
				select {
				case p := <-d.queue:
					d.deliver(p)
				default:
					return
				}
			}
		}
	}
}

func (d *delayConn) deliver(p delayed) {
	if w := time.Until(p.due); w > 0 {
		time.Sleep(w)
	}
	d.conn.WriteTo(p.b, p.addr) // UDP: a failed send is a lost datagram
}

func (d *delayConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	select {
	case <-d.done:
		return 0, net.ErrClosed
	default:
	}
	p := delayed{b: append([]byte(nil), b...), addr: addr, due: time.Now().Add(d.delay)}
	select {
	case d.queue <- p:
		return len(b), nil
	case <-d.done:
		return 0, net.ErrClosed
	}
}

func (d *delayConn) ReadFrom(b []byte) (int, net.Addr, error) { return d.conn.ReadFrom(b) }
func (d *delayConn) LocalAddr() net.Addr                      { return d.conn.LocalAddr() }
func (d *delayConn) SetDeadline(t time.Time) error            { return d.conn.SetDeadline(t) }
func (d *delayConn) SetReadDeadline(t time.Time) error        { return d.conn.SetReadDeadline(t) }
func (d *delayConn) SetWriteDeadline(t time.Time) error       { return d.conn.SetWriteDeadline(t) }

func (d *delayConn) Close() error {
	d.once.Do(func() { close(d.done) })
	<-d.flushed // a delay's wait at most
	return d.conn.Close()
}

var (
	grainOnce sync.Once
	grain     time.Duration
)

// TimerGrain is the shortest sleep this machine's timers give an idle
// process: ~1.1 ms on the 2-vCPU VMs of FIELD-NOTES.md. A round of seven
// 50 µs sleeps gives its second longest: a process busy on other
// goroutines sees shorter sleeps (its scheduler checks timers often), so
// not the median, as a delay line judged by a busy moment oversleeps once
// idle; and not the longest, which one preempted sleep would make. The
// grain is the least of five rounds: a node started beside others (a
// swarm on one machine) meets moments when every sleep is late, and one
// such round measured 2.7 ms here, which left a 1 ms delay out of that
// node alone.
func TimerGrain() time.Duration {
	grainOnce.Do(func() {
		for round := range 5 {
			var ds [7]time.Duration
			for i := range ds {
				t := time.Now()
				time.Sleep(50 * time.Microsecond)
				ds[i] = time.Since(t)
			}
			slices.Sort(ds[:])
			if g := ds[len(ds)-2]; round == 0 || g < grain {
				grain = g
			}
		}
	})
	return grain
}

// packetConn is what quic-go gets: udp itself, or udp behind a
// SendDelay delay line. A delay under half the timer grain cannot be
// emulated by sleeping (it would become the grain); it is left out with a
// warning, once per process.
func (c *Config) packetConn(udp *net.UDPConn) net.PacketConn {
	if c.SendDelay <= 0 {
		return udp
	}
	if g := TimerGrain(); c.SendDelay < g/2 {
		delayWarning.Do(func() {
			c.Log.Warn().Dur("delay", c.SendDelay).Dur("timer_grain", g).
				Msg("wire: -net-delay is below what this machine's timers can emulate; not applied (the network path's own latency stands in for it)")
		})
		return udp
	}
	c.Log.Debug().Dur("delay", c.SendDelay).Msg("wire: sending through a delay line")
	return newDelayConn(udp, c.SendDelay)
}

var delayWarning sync.Once
