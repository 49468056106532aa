// Cross-check of the in-repo register linearizability checker (jepsen-tests/src/register.rs)
// against Porcupine: reads histories in the harness's JSON-lines format (one file per
// argument) and prints, per file and key, whether Porcupine finds a linearization.
//
// Same rules as the in-repo checker: an `ok` operation happened between its invocation and
// completion; an `info` write or compare-and-set may take effect any time after its
// invocation, or never (it returns at infinity); `fail` operations and reads that did not
// succeed never happened.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"

	"github.com/anishathalye/porcupine"
)

type event struct {
	Process  uint64 `json:"process"`
	Type     string `json:"type"`
	F        string `json:"f"`
	Key      string `json:"key"`
	Value    *int64 `json:"value"`
	Expected *int64 `json:"expected"`
	TimeNs   int64  `json:"time_ns"`
}

type input struct {
	f        string
	value    int64
	expected int64
}

// read: the value read, or unset
type output struct {
	set   bool
	value int64
}

type state struct {
	set   bool
	value int64
}

var model = porcupine.Model{
	Init: func() interface{} { return state{} },
	Step: func(s, in, out interface{}) (bool, interface{}) {
		st := s.(state)
		i := in.(input)
		switch i.f {
		case "write":
			return true, state{true, i.value}
		case "cas":
			if st.set && st.value == i.expected {
				return true, state{true, i.value}
			}
			// only an indeterminate one is checked and may not have applied; an `ok`
			// one must have found its value
			return out.(output).set == false && out.(output).value == -1, st
		default:
			o := out.(output)
			return o.set == st.set && (!o.set || o.value == st.value), st
		}
	},
}

func check(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	open := map[uint64]event{}
	ops := map[string][]porcupine.Operation{}
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		var e event
		if err := json.Unmarshal(scanner.Bytes(), &e); err != nil {
			return nil, err
		}
		if e.Type == "invoke" {
			open[e.Process] = e
			continue
		}
		inv, ok := open[e.Process]
		if !ok {
			continue
		}
		delete(open, e.Process)
		addOp(ops, inv, &e)
	}
	// never completed: indeterminate
	for _, inv := range open {
		addOp(ops, inv, nil)
	}
	verdicts := map[string]bool{}
	for key, history := range ops {
		verdicts[key] = porcupine.CheckOperations(model, history)
	}
	return verdicts, scanner.Err()
}

func addOp(ops map[string][]porcupine.Operation, inv event, done *event) {
	kind := "info"
	if done != nil {
		kind = done.Type
	}
	op := porcupine.Operation{ClientId: int(inv.Process), Call: inv.TimeNs}
	switch {
	case kind == "fail":
		return
	case inv.F == "read" && kind == "ok":
		out := output{}
		if done.Value != nil {
			out = output{true, *done.Value}
		}
		op.Input, op.Output, op.Return = input{f: "read"}, out, done.TimeNs
	case inv.F == "write" || inv.F == "cas":
		in := input{f: inv.F, value: *inv.Value}
		if inv.Expected != nil {
			in.expected = *inv.Expected
		}
		op.Input = in
		if kind == "ok" {
			op.Output, op.Return = output{set: true}, done.TimeNs
		} else {
			// may take effect any time after the invocation, or never
			op.Output, op.Return = output{false, -1}, math.MaxInt64
		}
	default:
		return
	}
	ops[inv.Key] = append(ops[inv.Key], op)
}

func main() {
	for _, path := range os.Args[1:] {
		verdicts, err := check(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			os.Exit(2)
		}
		keys := make([]string, 0, len(verdicts))
		for k := range verdicts {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if len(keys) == 0 {
			// nothing to order: trivially linearizable
			line, _ := json.Marshal(map[string]interface{}{"file": path, "key": "", "linearizable": true})
			fmt.Println(string(line))
		}
		for _, k := range keys {
			line, _ := json.Marshal(map[string]interface{}{"file": path, "key": k, "linearizable": verdicts[k]})
			fmt.Println(string(line))
		}
	}
}
