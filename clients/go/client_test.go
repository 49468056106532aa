package client

// The Go client against the real local cluster (`make test` runs these through
// tests/clients.rs): GEOSTATE_CLUSTER names its cluster.json.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

func node(t *testing.T, region string) string {
	t.Helper()
	path := os.Getenv("GEOSTATE_CLUSTER")
	if path == "" {
		t.Fatal("GEOSTATE_CLUSTER is not set: run `make test`, or point it at a cluster.json")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cluster struct {
		Regions map[string]struct {
			Grpc string `json:"grpc"`
		} `json:"regions"`
	}
	if err := json.Unmarshal(raw, &cluster); err != nil {
		t.Fatal(err)
	}
	return cluster.Regions[region].Grpc
}

func unique(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + "go-" + hex.EncodeToString(b)
}

func dial(t *testing.T, region string) *Client {
	t.Helper()
	c, err := Dial(node(t, region), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestKeysLandWhereTheJavaProducerPutsThem(t *testing.T) {
	// the keys and partitions (of 12) of tests/partitioner.rs, from kafka-clients 4.1.1
	java := map[string]int32{"foobar": 6, "a-little-bit-longer-string": 11, "requests/9q8yy": 1,
		"surge/9q8yy": 5, "drivers/u4pruyd": 4, "zones/é": 9}
	for key, want := range java {
		if got := PartitionOf(key, 12); got != want {
			t.Errorf("%q: partition %d, the Java producer's is %d", key, got, want)
		}
	}
}

func TestACounterCountsAnIDOnceAndReachesTheOtherRegion(t *testing.T) {
	ctx := context.Background()
	us, eu := dial(t, "us-east-1"), dial(t, "eu-west-1")
	key := unique("drivers/")
	for _, add := range []struct {
		n    int64
		opts []WriteOption
	}{{5, nil}, {-2, []WriteOption{WithID("the-same-write")}}, {-2, []WriteOption{WithID("the-same-write")}}} {
		if _, err := us.Add(ctx, key, add.n, add.opts...); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := us.Counter(ctx, key); err != nil || n != 3 {
		t.Fatalf("us-east-1 reads %d (%v), want 3: the repeated id counts once", n, err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := eu.Counter(ctx, key)
		if err == nil && n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("eu-west-1 never merged the adds: %d, %v", n, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	f, err := eu.Freshness(ctx, key)
	if err != nil || len(f.Remotes) != 1 || f.Remotes[0].Region != "us-east-1" || f.Remotes[0].AppliedWallNanos == 0 {
		t.Fatalf("freshness %+v, %v", f, err)
	}
}

func TestARegisterReadsBackWithItsStampAndAnUnsetOneIsNil(t *testing.T) {
	ctx := context.Background()
	us := dial(t, "us-east-1")
	key := unique("zones/")
	if v, err := us.Get(ctx, key); v != nil || err != nil {
		t.Fatalf("an unset register: %+v, %v", v, err)
	}
	stamp, err := us.Set(ctx, key, []byte("downtown"))
	if err != nil || stamp.Origin != "us-east-1" {
		t.Fatalf("%+v, %v", stamp, err)
	}
	v, err := us.Get(ctx, key)
	if err != nil || string(v.Register) != "downtown" || v.Kind != "lww_register" || *v.Stamp != stamp {
		t.Fatalf("%+v, %v", v, err)
	}
}

func TestARefusedWriteIsNotRetried(t *testing.T) {
	_, err := dial(t, "us-east-1").Add(context.Background(), unique("zones/"), 1) // a register takes no add
	e, ok := err.(*Error)
	if !ok || e.Code != codes.InvalidArgument || e.Attempts != 1 {
		t.Fatalf("%v", err)
	}
}

func TestAnUnreachableNodeIsRetriedThenReported(t *testing.T) {
	free, err := net.Listen("tcp", "127.0.0.1:0") // a port nobody listens on once it is closed
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	c, err := Dial(addr, Options{Retries: 2, Backoff: 10 * time.Millisecond, Timeout: 2 * time.Second, NoRoute: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Add(context.Background(), unique("drivers/"), 1)
	e, ok := err.(*Error)
	if !ok || e.Code != codes.Unavailable || e.Attempts != 3 {
		t.Fatalf("%v", err)
	}
}

func TestKeysAreRoutedToTheNodeServingTheirPartition(t *testing.T) {
	ctx := context.Background()
	// seeded under another name of the node than the one it advertises: the route names
	// the advertised address only if Admin/Route was asked
	us, err := Dial(strings.Replace(node(t, "us-east-1"), "127.0.0.1", "localhost", 1), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer us.Close()
	key := unique("trips/")
	if _, err := us.Add(ctx, key, 2); err != nil {
		t.Fatal(err)
	}
	status, err := us.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// one node per region here: the region's node serves every partition
	if got := us.Route(ctx, key); got != status.Node {
		t.Fatalf("routed to %q, the node is %q", got, status.Node)
	}
}

func TestAWindowReadsItsEventsAndCertificate(t *testing.T) {
	ctx := context.Background()
	us := dial(t, "us-east-1")
	key := unique("requests/")
	now := uint64(time.Now().UnixMilli())
	start := now - now%60_000
	if _, err := us.Add(ctx, key, 4, WithEventTime(now)); err != nil {
		t.Fatal(err)
	}
	v, err := us.Get(ctx, key, WindowAt(start))
	if err != nil || v.Counter == nil || *v.Counter != 4 || v.Window == nil || v.Window.StartMs != start || v.Window.EndMs != start+60_000 || v.Window.Final {
		t.Fatalf("%+v, %v", v, err)
	}
	windows, err := us.Windows(ctx, key, start-60_000, start+60_000)
	if err != nil {
		t.Fatal(err)
	}
	counted := 0
	for _, w := range windows {
		if w.Counter != nil && *w.Counter != 0 {
			counted++
			if w.Window.StartMs != start {
				t.Fatalf("%+v", w)
			}
		}
	}
	if counted != 1 {
		t.Fatalf("%d windows counted the add: %+v", counted, windows)
	}
}

func TestThePricingServiceExampleRecordsAndQuotes(t *testing.T) {
	geohash := unique("")
	out, err := exec.Command("go", "run", "./examples/pricing", node(t, "us-east-1"), geohash, "1").CombinedOutput()
	if err != nil || !strings.Contains(string(out), geohash+": x1.00") {
		t.Fatalf("%s: %v", out, err)
	}
	now := uint64(time.Now().UnixMilli())
	windows, err := dial(t, "us-east-1").Windows(context.Background(), "requests/"+geohash, now-120_000, now+60_000)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, w := range windows {
		if w.Counter != nil {
			n += *w.Counter
		}
	}
	if n != 1 {
		t.Fatalf("the example recorded %d requests, want 1", n)
	}
}
