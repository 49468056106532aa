// Package client is a Go client of geostate's regional gRPC API
// (proto/geostate/v1/state.proto), with the same surface as the Python client:
//
//	geo, err := client.Dial("127.0.0.1:7001", client.Options{})
//	defer geo.Close()
//	_, err = geo.Add(ctx, "drivers/9q8yy", -1)                  // applied here when it returns
//	n, err := geo.Counter(ctx, "drivers/9q8yy")
//	stamp, err := geo.Set(ctx, "zones/9q8yy", []byte("downtown"))
//	v, err := geo.Get(ctx, "requests/9q8yy", client.LatestFinal()) // a window and is_final
//
// Every write carries an idempotency id (one is made when the caller gives none). A write
// whose outcome is unknown (UNAVAILABLE, DEADLINE_EXCEEDED) is sent again with the same id,
// so it counts once as long as the key took fewer than `ingest.dedup-window` other writes
// meanwhile; a refused write (INVALID_ARGUMENT, FAILED_PRECONDITION, ...) is returned at
// once. Each key's requests go to the node serving its partition (Admin/Route), asked again
// after a node answered that the partition moved; any node serves any key (it forwards).
package client

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "geostate.dev/client/geostatepb"
)

// Options of a Client; the zero value is usable.
type Options struct {
	// Each attempt's deadline (default 10 s).
	Timeout time.Duration
	// How often a call whose outcome is unknown is sent again (default 5; -1: never).
	Retries int
	// The first pause between attempts, doubled each time with jitter (default 50 ms).
	Backoff time.Duration
	// Send every key to the seed node instead of the node serving its partition.
	NoRoute bool
	// Dial options, e.g. grpc.WithTransportCredentials for a node with [tls]
	// (default: plaintext).
	DialOptions []grpc.DialOption
	// A bearer token for a node with [api.auth].
	Token string
}

// Client talks to one region through any of its nodes. Safe for concurrent use.
type Client struct {
	seed string
	opts Options

	mu         sync.Mutex
	conns      map[string]*grpc.ClientConn
	routes     map[int32]string
	partitions int32
}

// Error is a call that failed for good: its gRPC code, the node's message, and how many
// attempts were made.
type Error struct {
	Code     codes.Code
	Message  string
	Attempts int
}

func (e *Error) Error() string {
	if e.Attempts > 1 {
		return fmt.Sprintf("%s: %s (after %d attempts)", e.Code, e.Message, e.Attempts)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Dial makes a client of the region `seed` (host:port) belongs to; connections are made
// when first used.
func Dial(seed string, opts Options) (*Client, error) {
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.Retries == 0 {
		opts.Retries = 5
	} else if opts.Retries < 0 {
		opts.Retries = 0
	}
	if opts.Backoff == 0 {
		opts.Backoff = 50 * time.Millisecond
	}
	c := &Client{seed: seed, opts: opts, conns: map[string]*grpc.ClientConn{}, routes: map[int32]string{}}
	if _, err := c.conn(seed); err != nil {
		return nil, err
	}
	return c, nil
}

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = map[string]*grpc.ClientConn{}
	return nil
}

func (c *Client) conn(target string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if conn, ok := c.conns[target]; ok {
		return conn, nil
	}
	opts := c.opts.DialOptions
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, err
	}
	c.conns[target] = conn
	return conn, nil
}

func (c *Client) outgoing(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.opts.Token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.opts.Token)
	}
	return context.WithTimeout(ctx, c.opts.Timeout)
}

// Route answers the address of the node this client sends key's requests to: the one
// serving its partition (Admin/Route, asked once per partition), else the seed node.
func (c *Client) Route(ctx context.Context, key string) string {
	if c.opts.NoRoute {
		return c.seed
	}
	c.mu.Lock()
	if c.partitions > 0 {
		if node, ok := c.routes[PartitionOf(key, c.partitions)]; ok {
			c.mu.Unlock()
			return node
		}
	}
	c.mu.Unlock()
	conn, err := c.conn(c.seed)
	if err != nil {
		return c.seed
	}
	actx, cancel := c.outgoing(ctx)
	defer cancel()
	r, err := pb.NewAdminClient(conn).Route(actx, &pb.RouteRequest{Key: key})
	if err != nil || r.Node == "" {
		return c.seed // the seed node forwards
	}
	c.mu.Lock()
	c.partitions = r.Partitions
	c.routes[r.Partition] = r.Node
	c.mu.Unlock()
	return r.Node
}

func (c *Client) forgetRoute(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.partitions > 0 {
		delete(c.routes, PartitionOf(key, c.partitions))
	}
}

// call runs f against the node of key ("" : the seed), retrying unknown outcomes.
func call[T any](ctx context.Context, c *Client, key string, f func(context.Context, *grpc.ClientConn) (T, error)) (T, error) {
	pause := c.opts.Backoff
	for attempt := 1; ; attempt++ {
		target := c.seed
		if key != "" {
			target = c.Route(ctx, key)
		}
		var zero T
		conn, err := c.conn(target)
		if err != nil {
			return zero, err
		}
		actx, cancel := c.outgoing(ctx)
		out, err := f(actx, conn)
		cancel()
		if err == nil {
			return out, nil
		}
		s := status.Convert(err)
		if key != "" && s.Code() == codes.Unavailable {
			c.forgetRoute(key)
		}
		retried := s.Code() == codes.Unavailable || s.Code() == codes.DeadlineExceeded
		if !retried || attempt > c.opts.Retries || ctx.Err() != nil {
			return zero, &Error{Code: s.Code(), Message: s.Message(), Attempts: attempt}
		}
		jitter := time.Duration(float64(pause) * (0.5 + rand.Float64()))
		select {
		case <-time.After(jitter):
		case <-ctx.Done():
			return zero, &Error{Code: codes.Canceled, Message: ctx.Err().Error(), Attempts: attempt}
		}
		pause *= 2
	}
}

// Position is where a write was appended in the region's updates topic.
type Position struct {
	Partition int32
	Offset    int64
}

// Stamp is a register value's order stamp: (epoch, hybrid clock, origin region).
type Stamp struct {
	Epoch     uint64
	WallNanos uint64
	Logical   uint32
	Origin    string
}

func stampOf(s *pb.OrderStamp) Stamp {
	if s == nil {
		return Stamp{}
	}
	return Stamp{Epoch: s.Epoch, WallNanos: s.GetHlc().GetWallNanos(), Logical: s.GetHlc().GetLogical(), Origin: s.Origin}
}

// WriteOption sets a write's idempotency id or event time.
type WriteOption func(*pb.UpdateRequest)

// WithID gives the write this idempotency id (default: a random one).
func WithID(id string) WriteOption { return func(r *pb.UpdateRequest) { r.Id = id } }

// WithEventTime gives the write an event time (ms since the Unix epoch): windowed keys
// count it in the window holding it.
func WithEventTime(ms uint64) WriteOption { return func(r *pb.UpdateRequest) { r.EventTimeMs = ms } }

func (c *Client) update(ctx context.Context, r *pb.UpdateRequest, opts []WriteOption) (*pb.UpdateResponse, error) {
	for _, o := range opts {
		o(r)
	}
	if r.Id == "" {
		b := make([]byte, 16)
		crand.Read(b)
		r.Id = "go-" + hex.EncodeToString(b)
	}
	return call(ctx, c, r.Key, func(ctx context.Context, conn *grpc.ClientConn) (*pb.UpdateResponse, error) {
		return pb.NewStateClient(conn).Update(ctx, r)
	})
}

// Add adds n to a counter (a g_counter takes n > 0); it returns once applied here.
func (c *Client) Add(ctx context.Context, key string, n int64, opts ...WriteOption) (Position, error) {
	r, err := c.update(ctx, &pb.UpdateRequest{Key: key, Op: &pb.UpdateRequest_Add{Add: n}}, opts)
	if err != nil {
		return Position{}, err
	}
	return Position{Partition: r.GetPosition().GetPartition(), Offset: r.GetPosition().GetOffset()}, nil
}

// Set writes a register and returns the write's order stamp.
func (c *Client) Set(ctx context.Context, key string, value []byte, opts ...WriteOption) (Stamp, error) {
	r, err := c.update(ctx, &pb.UpdateRequest{Key: key, Op: &pb.UpdateRequest_Set{Set: value}}, opts)
	if err != nil {
		return Stamp{}, err
	}
	return stampOf(r.Stamp), nil
}

// CompareAndSet writes an owned register if it holds expected (nil: never set); a
// mismatch is an *Error with FailedPrecondition naming the current value.
func (c *Client) CompareAndSet(ctx context.Context, key string, expected, value []byte, opts ...WriteOption) (Stamp, error) {
	cas := &pb.CompareAndSet{Value: value, Expected: expected}
	r, err := c.update(ctx, &pb.UpdateRequest{Key: key, Op: &pb.UpdateRequest_Cas{Cas: cas}}, opts)
	if err != nil {
		return Stamp{}, err
	}
	return stampOf(r.Stamp), nil
}

// RemoteFreshness is what a read holds of one remote region: its newest delta merged.
type RemoteFreshness struct {
	Region           string
	AppliedWallNanos uint64
	LagMs            uint64
}

// Freshness is how current a read is.
type Freshness struct {
	Remotes []RemoteFreshness
	// For owned keys: the lease epoch of the value.
	Epoch uint64
	// Set when the node answered from its copy of a partition it no longer owns, while no
	// node of its region was known to own it (its region's Kafka unreachable, or the
	// partition between nodes).
	Copy *StaleCopy
}

// StaleCopy is how old a copy answering a read is: it holds what its node applied of the
// region's updates topic (through AppliedOffset, -1: none) until AgeMs ago, nothing since.
type StaleCopy struct {
	AgeMs         uint64
	AppliedOffset int64
}

// LagMs is the largest lag over the remote regions (0 with none).
func (f Freshness) LagMs() uint64 {
	var most uint64
	for _, r := range f.Remotes {
		most = max(most, r.LagMs)
	}
	return most
}

// Window is a windowed value's window and whether it is final (the same in every region,
// for good).
type Window struct {
	StartMs, EndMs, ClosesAtMs uint64
	Final                      bool
	// Not final: the regions whose watermark has not passed ClosesAtMs.
	Behind []string
}

// Value is one key's value in this region.
type Value struct {
	Key string
	// "g_counter", "pn_counter" or "lww_register".
	Kind      string
	Counter   *int64
	Register  []byte
	Stamp     *Stamp
	Freshness Freshness
	Window    *Window
	Saturated bool
}

var kinds = map[pb.CrdtKind]string{
	pb.CrdtKind_CRDT_KIND_G_COUNTER:    "g_counter",
	pb.CrdtKind_CRDT_KIND_PN_COUNTER:   "pn_counter",
	pb.CrdtKind_CRDT_KIND_LWW_REGISTER: "lww_register",
}

func valueOf(v *pb.Value) Value {
	out := Value{Key: v.Key, Kind: kinds[v.Kind], Saturated: v.Saturated}
	switch x := v.Value.(type) {
	case *pb.Value_Counter:
		n := x.Counter
		out.Counter = &n
	case *pb.Value_Register:
		out.Register = x.Register
	}
	if v.Stamp != nil {
		s := stampOf(v.Stamp)
		out.Stamp = &s
	}
	for _, r := range v.GetFreshness().GetRemotes() {
		out.Freshness.Remotes = append(out.Freshness.Remotes, RemoteFreshness{r.Region, r.GetApplied().GetWallNanos(), r.LagMs})
	}
	out.Freshness.Epoch = v.GetFreshness().GetEpoch()
	if c := v.GetFreshness().GetCopy(); c != nil {
		out.Freshness.Copy = &StaleCopy{AgeMs: c.AgeMs, AppliedOffset: c.AppliedOffset}
	}
	if w := v.Window; w != nil {
		win := &Window{StartMs: w.StartMs, EndMs: w.EndMs, ClosesAtMs: w.ClosesAtMs, Final: w.IsFinal}
		for _, b := range w.Behind {
			win.Behind = append(win.Behind, b.Region)
		}
		out.Window = win
	}
	return out
}

// ReadOption picks a window of a windowed key, or asks the lease holder.
type ReadOption func(*pb.GetRequest)

// WindowAt reads the window starting at startMs (rounded down to the slide).
func WindowAt(startMs uint64) ReadOption {
	return func(r *pb.GetRequest) {
		r.Window = &pb.WindowSelector{Which: &pb.WindowSelector_StartMs{StartMs: startMs}}
	}
}

// LatestFinal reads the newest window final in every region.
func LatestFinal() ReadOption {
	return func(r *pb.GetRequest) {
		r.Window = &pb.WindowSelector{Which: &pb.WindowSelector_LatestFinal{LatestFinal: true}}
	}
}

// Leaseholder reads an owned key at its lease holder only (it sees every write the
// holder acknowledged).
func Leaseholder() ReadOption { return func(r *pb.GetRequest) { r.Leaseholder = true } }

// Get reads key here; a register never set is (nil, nil).
func (c *Client) Get(ctx context.Context, key string, opts ...ReadOption) (*Value, error) {
	r := &pb.GetRequest{Key: key}
	for _, o := range opts {
		o(r)
	}
	v, err := call(ctx, c, key, func(ctx context.Context, conn *grpc.ClientConn) (*pb.Value, error) {
		return pb.NewStateClient(conn).Get(ctx, r)
	})
	var e *Error
	if errors.As(err, &e) && e.Code == codes.NotFound {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := valueOf(v)
	return &out, nil
}

// Counter reads a counter (0 if never touched).
func (c *Client) Counter(ctx context.Context, key string, opts ...ReadOption) (int64, error) {
	v, err := c.Get(ctx, key, opts...)
	if err != nil || v == nil || v.Counter == nil {
		return 0, err
	}
	return *v.Counter, nil
}

// Register reads a register (nil if never set).
func (c *Client) Register(ctx context.Context, key string, opts ...ReadOption) ([]byte, error) {
	v, err := c.Get(ctx, key, opts...)
	if err != nil || v == nil {
		return nil, err
	}
	return v.Register, nil
}

// Freshness is how current this region's copy of key's partition is.
func (c *Client) Freshness(ctx context.Context, key string) (Freshness, error) {
	v, err := c.Get(ctx, key)
	if err != nil || v == nil {
		return Freshness{}, err
	}
	return v.Freshness, nil
}

// Windows reads every window of a windowed key starting in [fromMs, toMs), oldest first.
func (c *Client) Windows(ctx context.Context, key string, fromMs, toMs uint64) ([]Value, error) {
	req := &pb.BatchGetRequest{Keys: []string{key}, Window: &pb.WindowSelector{
		Which: &pb.WindowSelector_Range{Range: &pb.WindowRange{FromMs: fromMs, ToMs: toMs}}}}
	r, err := call(ctx, c, "", func(ctx context.Context, conn *grpc.ClientConn) (*pb.BatchGetResponse, error) {
		return pb.NewStateClient(conn).BatchGet(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	out := make([]Value, 0, len(r.Values))
	for _, v := range r.Values {
		out = append(out, valueOf(v))
	}
	return out, nil
}

// Status is Admin/Status of the seed node (the raw message).
func (c *Client) Status(ctx context.Context) (*pb.StatusResponse, error) {
	return call(ctx, c, "", func(ctx context.Context, conn *grpc.ClientConn) (*pb.StatusResponse, error) {
		return pb.NewAdminClient(conn).Status(ctx, &pb.StatusRequest{})
	})
}

// Murmur2 is Kafka's murmur2 (the Java producer's Utils.murmur2).
func Murmur2(data []byte) uint32 {
	const m, r = uint32(0x5bd1e995), 24
	h := uint32(0x9747b28c) ^ uint32(len(data))
	n := len(data) - len(data)%4
	for i := 0; i < n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch tail := data[n:]; len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// PartitionOf is key's partition among partitions, as every geostate topic places it.
func PartitionOf(key string, partitions int32) int32 {
	return int32(Murmur2([]byte(key))&0x7fffffff) % partitions
}
