package main

import "testing"

func TestParseSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"8MiB", 8 << 20}, {"64KiB", 64 << 10}, {"1GiB", 1 << 30}, {"100B", 100}, {"4096", 4096}, {" 2 MiB ", 2 << 20},
		{"8XB", 0}, {"0", 0}, {"-1MiB", 0}, {"MiB", 0},
	} {
		got, err := parseSize(tc.in)
		if got != tc.want || (err != nil) != (tc.want == 0) {
			t.Errorf("parseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}
