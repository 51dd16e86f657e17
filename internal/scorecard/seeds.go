package scorecard

import (
	"fmt"
	"strconv"
	"strings"
)

// maxSeeds bounds a seed list: each seed is a whole scorecard run.
const maxSeeds = 100

// ParseSeeds reads a seed list: comma-separated seeds or ranges, such as "1-5" or "1,3,7-9".
func ParseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, errA := strconv.ParseUint(strings.TrimSpace(lo), 10, 64)
		b, errB := a, error(nil)
		if isRange {
			b, errB = strconv.ParseUint(strings.TrimSpace(hi), 10, 64)
		}
		if errA != nil || errB != nil || b < a {
			return nil, fmt.Errorf("--seeds %q: %q is not a seed or a range such as 1-5", s, part)
		}
		if b-a >= maxSeeds || len(out)+int(b-a+1) > maxSeeds {
			return nil, fmt.Errorf("--seeds %q: more than %d seeds", s, maxSeeds)
		}
		for v := a; ; v++ {
			out = append(out, v)
			if v == b {
				break
			}
		}
	}
	return out, nil
}
