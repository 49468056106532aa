// The surge multiplier as a geostate user function, served as a gRPC sidecar:
//
//	go run ./examples/surgefunction -listen unix:///tmp/surge.sock
//
// and in the region file:
//
//	[pricing]
//	function = "unix:///tmp/surge.sock"
//
// It gives the same values as the built-in formula (clients/conformance/surge.json):
// multiplier = clamp(1 + slope * (demand / max(supply, 1) - threshold), 1, max), rounded
// half away from zero to the nearest step, in hundredths.
package main

import (
	"context"
	"flag"
	"log"
	"math"

	"geostate.dev/client/function"
)

type surge struct{}

func (surge) Name() string    { return "surge" }
func (surge) Version() string { return "1" }

// Compute gives one multiplier per final window of a geohash, from its demand and supply.
func (surge) Compute(_ context.Context, params map[string]float64, inputs []function.Input) ([]int64, error) {
	out := make([]int64, len(inputs))
	for i, in := range inputs {
		out[i] = hundredths(params, in.Values["demand"], in.Values["supply"])
	}
	return out, nil
}

func hundredths(params map[string]float64, demand, supply int64) int64 {
	threshold, slope, top, step := params["threshold"], params["slope"], params["max"], params["step"]
	ratio := float64(demand) / float64(max(supply, 1))
	// float64(...): each product rounded on its own, never fused into an FMA
	raw := min(max(1+float64(slope*(ratio-threshold)), 1), top)
	stepped := float64(math.Round(raw/step) * step)
	return int64(math.Round(float64(min(max(stepped, 1), top) * 100)))
}

func main() {
	listen := flag.String("listen", "", "unix:///path/to.sock or host:port")
	flag.Parse()
	if *listen == "" {
		log.Fatal("-listen is required")
	}
	lis, err := function.Listen(*listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("surge 1 serving on %s", *listen)
	log.Fatal(function.Serve(lis, surge{}))
}
