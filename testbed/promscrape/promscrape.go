// Package promscrape reads a Prometheus text endpoint for benchmarks: counters, and quantiles of a
// histogram between two scrapes (linear interpolation inside the bucket, as histogram_quantile does).
package promscrape

import (
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Scrape is one reading: metric line (name plus labels) -> value.
type Scrape map[string]float64

// Get reads url (http://host:port/metrics).
func Get(url string) (Scrape, error) {
	return GetTLS(url, nil)
}

// GetTLS reads url (https://host:port/metrics of a --metrics-tls endpoint) with cfg, which carries
// the client certificate; nil cfg is Get. An answer other than 200 is an error.
func GetTLS(url string, cfg *tls.Config) (Scrape, error) {
	c := http.Client{Timeout: 10 * time.Second}
	if cfg != nil {
		c.Transport = &http.Transport{TLSClientConfig: cfg}
	}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, body)
	}
	out := Scrape{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, nil
}

// Quantile returns the q-quantile (0..1) of histogram name over the observations made between
// before and after.
func Quantile(before, after Scrape, name string, q float64) (float64, error) {
	type bucket struct{ le, count float64 }
	var bs []bucket
	prefix := name + `_bucket{le="`
	for k, v := range after {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		leS := strings.TrimSuffix(strings.TrimPrefix(k, prefix), `"}`)
		le := math.Inf(1)
		if leS != "+Inf" {
			var err error
			if le, err = strconv.ParseFloat(leS, 64); err != nil {
				return 0, err
			}
		}
		bs = append(bs, bucket{le, v - before[k]})
	}
	if len(bs) == 0 {
		return 0, fmt.Errorf("histogram %s not found", name)
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	total := bs[len(bs)-1].count
	if total <= 0 {
		return 0, fmt.Errorf("histogram %s: no observations", name)
	}
	rank := q * total
	prevLe, prevCount := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return prevLe, nil
			}
			if b.count == prevCount {
				return b.le, nil
			}
			return prevLe + (b.le-prevLe)*(rank-prevCount)/(b.count-prevCount), nil
		}
		prevLe, prevCount = b.le, b.count
	}
	return prevLe, nil
}
