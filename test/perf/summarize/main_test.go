package main

import (
	"bytes"
	"image/png"
	"strings"
	"testing"
)

const sample = `params: runs=3
R 1 write_bw perftest 65536 0.90 0.80 0.0015
R 1 write_bw verbs 65536 0.80 0.78 0.0014
R 2 write_bw perftest 65536 0.90 1.00 0.0015
R 2 write_bw verbs 65536 0.80 0.50 0.0014
R 3 write_bw perftest 65536 0.90 0.90 0.0015
R 3 write_bw verbs 65536 0.80 0.90 0.0014
R 3 write_bw async 65536 0.80 0.45 0.0014
T 3 write_bw async 65536 2 s
R 1 send_lat perftest 8 1 9 10 10 1 20 30
R 1 send_lat verbs 8 1 9 11 10 1 20 30
R 1 send_lat async 8 1 9 20 10 1 20 30
R 1 send_lat async_unlocked 8 1 9 15 10 1 20 30
FAIL write_mr verbs 2 (client 1, server 0)
R 1 write_mr verbs 2 garbage here 1 2 3
`

func TestSummarize(t *testing.T) {
	order, data, notes := parse(strings.NewReader(sample))
	pts := summarize(order, data)
	if len(pts) != 2 || len(notes) != 2 {
		t.Fatalf("%d points, %d notes", len(pts), len(notes))
	}
	w := pts[0]
	// medians: perftest avg 0.9, verbs 0.78, async 0.45
	if w.Median["perftest"] != 0.9 || w.Median["verbs"] != 0.78 || w.Runs["verbs"] != 3 || w.Runs["async"] != 1 {
		t.Errorf("write_bw %+v", w)
	}
	if r := w.Ratio["verbs"]; r < 0.866 || r > 0.867 || w.Met["verbs"] || w.Met["async"] {
		t.Errorf("write_bw ratio %v met %v", r, w.Met)
	}
	l := pts[1]
	if l.Ratio["verbs"] != 1.1 || !l.Met["verbs"] || l.Ratio["async"] != 2 || l.Met["async"] {
		t.Errorf("send_lat ratios %v met %v", l.Ratio, l.Met)
	}
	var out bytes.Buffer
	table(&out, pts)
	for _, want := range []string{"| write_bw | 64 KiB |", "0.87×", "verbs missed", "verbs met, async missed", "Runs per point: up to 3", "| send_lat | 8 B | async_unlocked | t_typical [usec] | 15 | 1.50× |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	var img bytes.Buffer
	if err := png.Encode(&img, chart(pts)); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&img); err != nil {
		t.Fatal(err)
	}
}
