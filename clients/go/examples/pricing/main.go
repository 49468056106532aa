// A pricing service's use of geostate, to copy: record ride requests and driver pings per
// geohash (windowed counters, event time = now), and quote a ride from the surge
// multiplier the region's pricer wrote (prices/<geohash>, JSON), 1.0 while none is written
// yet. Prints each quote with how fresh this region's view of the other regions is.
//
//	go run ./examples/pricing HOST:PORT GEOHASH [ROUNDS]
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	client "geostate.dev/client"
)

// quote is the multiplier for geohash, the window it was computed from (nil: none yet),
// and how far behind the slowest other region this region's copy is.
func quote(ctx context.Context, geo *client.Client, geohash string) (float64, []uint64, uint64, error) {
	price, err := geo.Get(ctx, "prices/"+geohash)
	if err != nil || price == nil || price.Register == nil {
		return 1.0, nil, 0, err
	}
	var result struct {
		StartMs uint64  `json:"start_ms"`
		EndMs   uint64  `json:"end_ms"`
		Value   float64 `json:"value"`
	}
	if err := json.Unmarshal(price.Register, &result); err != nil {
		return 1.0, nil, 0, err
	}
	return result.Value, []uint64{result.StartMs, result.EndMs}, price.Freshness.LagMs(), nil
}

func main() {
	target, geohash, rounds := "127.0.0.1:7001", "9q8yy", 5
	if len(os.Args) > 1 {
		target = os.Args[1]
	}
	if len(os.Args) > 2 {
		geohash = os.Args[2]
	}
	if len(os.Args) > 3 {
		rounds, _ = strconv.Atoi(os.Args[3])
	}
	geo, err := client.Dial(target, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer geo.Close()
	ctx := context.Background()
	for i := 0; i < rounds; i++ {
		now := uint64(time.Now().UnixMilli())
		if _, err := geo.Add(ctx, "requests/"+geohash, 1, client.WithEventTime(now)); err != nil { // a rider asks
			log.Fatal(err)
		}
		if _, err := geo.Add(ctx, "supply/"+geohash, 1, client.WithEventTime(now)); err != nil { // a driver pings
			log.Fatal(err)
		}
		multiplier, window, lag, err := quote(ctx, geo, geohash)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: x%.2f (window %v, other regions %d ms behind)\n", geohash, multiplier, window, lag)
		if i+1 < rounds {
			time.Sleep(time.Second)
		}
	}
}
