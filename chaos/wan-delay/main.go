// wan-delay holds every packet iptables queues to it (NFQUEUE) for a delay plus a random
// jitter, then lets it go: WAN latency between the sites of the local cluster, whose
// processes all talk over the loopback interface (`cluster.py net delay`). The kernel
// here has no netem; this is the same effect in user space. Packets may overtake each
// other when the jitter exceeds their spacing, as on a real network.
//
//	wan-delay --queue 147 --delay 50ms --jitter 20ms
//
// Runs until SIGTERM; with the rule's --queue-bypass, packets pass undelayed once it is
// gone.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	nfqueue "github.com/florianl/go-nfqueue"
)

func main() {
	queue := flag.Uint("queue", 0, "the NFQUEUE number the iptables rules send packets to")
	delay := flag.Duration("delay", 50*time.Millisecond, "how long each packet is held")
	jitter := flag.Duration("jitter", 0, "each packet's delay varies this much either way")
	flag.Parse()
	if *queue == 0 || *queue > 65535 || *jitter > *delay {
		fmt.Fprintln(os.Stderr, "wan-delay: --queue 1..65535 and --jitter <= --delay are required")
		os.Exit(2)
	}
	nf, err := nfqueue.Open(&nfqueue.Config{
		NfQueue:      uint16(*queue),
		MaxPacketLen: 0xFFFF,
		MaxQueueLen:  0xFFFF,
		Copymode:     nfqueue.NfQnlCopyPacket,
		WriteTimeout: 50 * time.Millisecond,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "wan-delay: opening the queue:", err)
		os.Exit(1)
	}
	defer nf.Close()
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	var held atomic.Uint64
	hold := func(a nfqueue.Attribute) int {
		id := *a.PacketID
		d := *delay
		if *jitter > 0 {
			d += time.Duration(rand.Int63n(int64(2**jitter)+1)) - *jitter
		}
		held.Add(1)
		time.AfterFunc(d, func() {
			if err := nf.SetVerdict(id, nfqueue.NfAccept); err != nil {
				fmt.Fprintln(os.Stderr, "wan-delay: verdict:", err)
			}
		})
		return 0
	}
	onError := func(e error) int {
		if ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "wan-delay:", e)
		}
		return 0
	}
	if err := nf.RegisterWithErrorFunc(ctx, hold, onError); err != nil {
		fmt.Fprintln(os.Stderr, "wan-delay: registering:", err)
		os.Exit(1)
	}
	fmt.Printf("wan-delay: queue %d, %v ± %v\n", *queue, *delay, *jitter)
	<-ctx.Done()
	fmt.Printf("wan-delay: held %d packets\n", held.Load())
}
