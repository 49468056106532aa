package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"geostate.dev/client/function"
	pb "geostate.dev/client/geostatepb"
)

type suite struct {
	Cases []struct {
		Params map[string]float64 `json:"params"`
		Inputs []struct {
			Key           string           `json:"key"`
			WindowStartMs uint64           `json:"window_start_ms"`
			WindowEndMs   uint64           `json:"window_end_ms"`
			Values        map[string]int64 `json:"values"`
		} `json:"inputs"`
		Expected []int64 `json:"expected"`
	} `json:"cases"`
}

// The example, served on a Unix socket and called over gRPC as the pricer calls it,
// passes the conformance suite every surge function passes.
func TestTheSurgeExamplePassesTheConformanceSuite(t *testing.T) {
	raw, err := os.ReadFile("../../../conformance/surge.json")
	if err != nil {
		t.Fatal(err)
	}
	var s suite
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "surge.sock")
	lis, err := function.Listen("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	server := function.NewServer(surge{})
	go server.Serve(lis)
	defer server.Stop()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stub := pb.NewFunctionClient(conn)
	ctx := context.Background()
	described, err := stub.Describe(ctx, &pb.DescribeRequest{})
	if err != nil || described.GetName() != "surge" || described.GetRuntime() != "go" {
		t.Fatalf("Describe: %v %v", described, err)
	}
	for _, c := range s.Cases {
		req := &pb.ComputeRequest{Function: "surge", Params: c.Params}
		for _, in := range c.Inputs {
			req.Inputs = append(req.Inputs, &pb.FunctionInput{Key: in.Key, WindowStartMs: in.WindowStartMs, WindowEndMs: in.WindowEndMs, Values: in.Values})
		}
		resp, err := stub.Compute(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for _, r := range resp.GetResults() {
			got = append(got, r.GetValue())
		}
		if !slices.Equal(got, c.Expected) {
			t.Errorf("params %v: got %v, want %v", c.Params, got, c.Expected)
		}
	}
	_, err = stub.Compute(ctx, &pb.ComputeRequest{Function: "other"})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("a batch for another function: %v, want INVALID_ARGUMENT", err)
	}
}
