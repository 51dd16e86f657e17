// Package suggest finds the "did you mean" for a misspelt name: of a config key, a command's
// verb or flag, a policy parameter.
package suggest

// Nearest returns the name closest to key by edit distance, if it is within 2 edits; failing
// that, the name that key is the singular or plural of (policy for policies, and the other
// way round: three edits apart), or else the one name that begins with key, when key has at
// least 3 letters (inst for instances: the flag package takes no abbreviation). "" if none
// is near.
func Nearest(key string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := editDistance(key, n, bestD); d < bestD {
			best, bestD = n, d
		}
	}
	if best != "" || key == "" {
		return best
	}
	for _, n := range names {
		if singular(n) == singular(key) {
			return n
		}
	}
	if len(key) < 3 {
		return ""
	}
	for _, n := range names {
		if len(n) > len(key) && n[:len(key)] == key {
			if best != "" {
				return "" // two names begin so: no one guess
			}
			best = n
		}
	}
	return best
}

// singular is word without an English plural's ending (policies: policy, seeds: seed); other
// words come back as they are.
func singular(word string) string {
	switch {
	case len(word) > 3 && word[len(word)-3:] == "ies":
		return word[:len(word)-3] + "y"
	case len(word) > 1 && word[len(word)-1] == 's' && word[len(word)-2] != 's':
		return word[:len(word)-1]
	}
	return word
}

// editDistance is the Levenshtein distance between a and b, or limit when it is at least limit.
func editDistance(a, b string, limit int) int {
	if len(a) > 64 || len(b) > 64 || max(len(a)-len(b), len(b)-len(a)) >= limit {
		return limit
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], limit)
}
