package install

import (
	"net"
	"sync"
	"time"
)

// relayUDP forwards datagrams arriving on listen to target and the answers back, with one upstream
// socket per client address (so the BMC keeps each client's RMCP+ sessions apart). It stands for
// the routed management network between the nodes and the BMCs, which listen on the host's
// loopback. It never answers by itself: with the relay stopped, a fence call gets no answer and
// fails. stop closes every socket.
func relayUDP(listen, target string) (stop func(), err error) {
	pc, err := net.ListenPacket("udp", listen)
	if err != nil {
		return nil, err
	}
	raddr, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		pc.Close()
		return nil, err
	}
	var (
		mu       sync.Mutex
		upstream = map[string]*net.UDPConn{}
		wg       sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			mu.Lock()
			up := upstream[from.String()]
			if up == nil {
				if up, err = net.DialUDP("udp", nil, raddr); err != nil {
					mu.Unlock()
					continue
				}
				upstream[from.String()] = up
				wg.Add(1)
				go func() {
					defer wg.Done()
					b := make([]byte, 65535)
					for {
						_ = up.SetReadDeadline(time.Now().Add(10 * time.Minute))
						m, err := up.Read(b)
						if err != nil {
							return
						}
						_, _ = pc.WriteTo(b[:m], from)
					}
				}()
			}
			mu.Unlock()
			_, _ = up.Write(buf[:n])
		}
	}()
	return func() {
		pc.Close()
		mu.Lock()
		for _, up := range upstream {
			up.Close()
		}
		mu.Unlock()
		wg.Wait()
	}, nil
}
