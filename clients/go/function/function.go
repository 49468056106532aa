// Package function serves a geostate user function (geostate.v1.Function,
// proto/geostate/v1/function.proto) as a gRPC sidecar:
//
//	type surge struct{}
//	func (surge) Name() string    { return "surge" }
//	func (surge) Version() string { return "1" }
//	func (surge) Compute(ctx context.Context, params map[string]float64, in []function.Input) ([]int64, error) {
//		...one value per input...
//	}
//	lis, err := function.Listen("unix:///run/geostate/surge.sock")
//	err = function.Serve(lis, surge{})
//
// geostate calls a function with batches of final windows, one call per batch, never per
// event; it answers one integer per input and touches no state. `geostate pricer` writes
// each answer with a compare-and-set from the window before, so a retried batch never
// publishes twice. A function must be deterministic: the same params and inputs give the
// same values in every region and on every retry (in Go, round float products with an
// explicit float64(...) conversion: the compiler may otherwise fuse a*b+c into one FMA on
// some architectures, and give other bits than the other implementations).
package function

import (
	"context"
	"net"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "geostate.dev/client/geostatepb"
)

// Input is one final window of one key, and the values geostate read for it.
type Input struct {
	Key           string
	WindowStartMs uint64
	WindowEndMs   uint64
	Values        map[string]int64
}

// Function is a user function.
type Function interface {
	// Name is what geostate calls it by ("surge").
	Name() string
	// Version is for operators (Admin/Status shows it).
	Version() string
	// Compute answers one value per input, in order. An error fails the batch
	// (INTERNAL); geostate retries it with a backoff.
	Compute(ctx context.Context, params map[string]float64, inputs []Input) ([]int64, error)
}

// Listen listens on "unix:///path/to.sock" (a socket a previous run left is removed) or
// "host:port".
func Listen(address string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(address, "unix://"); ok {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		return net.Listen("unix", path)
	}
	return net.Listen("tcp", address)
}

// Serve serves f on lis until the listener fails or the server is stopped.
func Serve(lis net.Listener, f Function) error {
	return NewServer(f).Serve(lis)
}

// NewServer is a server of f, for a caller that stops it itself.
func NewServer(f Function) *grpc.Server {
	server := grpc.NewServer()
	pb.RegisterFunctionServer(server, &servicer{f: f})
	return server
}

type servicer struct {
	pb.UnimplementedFunctionServer
	f Function
}

func (s *servicer) Describe(context.Context, *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	return &pb.DescribeResponse{Name: s.f.Name(), Version: s.f.Version(), Runtime: "go"}, nil
}

func (s *servicer) Compute(ctx context.Context, req *pb.ComputeRequest) (*pb.ComputeResponse, error) {
	if req.GetFunction() != s.f.Name() {
		return nil, status.Errorf(codes.InvalidArgument, "this sidecar serves %q, not %q", s.f.Name(), req.GetFunction())
	}
	inputs := make([]Input, len(req.GetInputs()))
	for i, in := range req.GetInputs() {
		inputs[i] = Input{Key: in.GetKey(), WindowStartMs: in.GetWindowStartMs(), WindowEndMs: in.GetWindowEndMs(), Values: in.GetValues()}
	}
	values, err := s.f.Compute(ctx, req.GetParams(), inputs)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s: %v", s.f.Name(), err)
	}
	if len(values) != len(inputs) {
		return nil, status.Errorf(codes.Internal, "%s gave %d values for %d inputs", s.f.Name(), len(values), len(inputs))
	}
	results := make([]*pb.FunctionResult, len(values))
	for i, v := range values {
		results[i] = &pb.FunctionResult{Value: v}
	}
	return &pb.ComputeResponse{Results: results}, nil
}
