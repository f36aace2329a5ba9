package eviction

import (
	"fmt"
	"math/big"
	"strings"
)

var suffixes = map[string]*big.Rat{
	"n": big.NewRat(1, 1e9), "u": big.NewRat(1, 1e6), "m": big.NewRat(1, 1e3), "": big.NewRat(1, 1),
	"k": big.NewRat(1e3, 1), "M": big.NewRat(1e6, 1), "G": big.NewRat(1e9, 1), "T": big.NewRat(1e12, 1),
	"P": big.NewRat(1e15, 1), "E": big.NewRat(1e18, 1),
	"Ki": new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), 10)),
	"Mi": new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), 20)),
	"Gi": new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), 30)),
	"Ti": new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), 40)),
	"Pi": new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), 50)),
	"Ei": new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), 60)),
}

// ParseQuantity parses a Kubernetes resource quantity ("100Mi", "1.5G", "1e3", "500m") and returns
// its value as an integer, rounded up like resource.Quantity.Value. It accepts the Kubernetes
// grammar: an optional sign, digits with an optional fraction, then a binary-SI suffix (Ki..Ei), a
// decimal-SI suffix (n, u, m, k, M, G, T, P, E) or a decimal exponent (e3, E-2). Values that do not
// fit in an int64 are errors.
func ParseQuantity(s string) (int64, error) {
	bad := func() (int64, error) { return 0, fmt.Errorf("quantity %q: want e.g. 100Mi, 1.5G or 10", s) }
	num := s
	sign := ""
	if strings.HasPrefix(num, "+") || strings.HasPrefix(num, "-") {
		sign, num = num[:1], num[1:]
	}
	i := 0
	digits := 0
	for i < len(num) && num[i] >= '0' && num[i] <= '9' {
		i, digits = i+1, digits+1
	}
	if i < len(num) && num[i] == '.' {
		i++
		for i < len(num) && num[i] >= '0' && num[i] <= '9' {
			i, digits = i+1, digits+1
		}
	}
	if digits == 0 {
		return bad()
	}
	mantissa, suffix := num[:i], num[i:]
	v, ok := new(big.Rat).SetString(sign + mantissa)
	if !ok {
		return bad()
	}
	if mult, ok := suffixes[suffix]; ok {
		v.Mul(v, mult)
	} else if len(suffix) > 1 && (suffix[0] == 'e' || suffix[0] == 'E') {
		exp := suffix[1:]
		if strings.HasPrefix(exp, "+") || strings.HasPrefix(exp, "-") {
			exp = exp[1:]
		}
		if exp == "" || len(exp) > 3 || strings.Trim(exp, "0123456789") != "" {
			return bad()
		}
		e, ok := new(big.Rat).SetString("1" + suffix)
		if !ok {
			return bad()
		}
		v.Mul(v, e)
	} else {
		return bad()
	}
	// Round up (towards +infinity), as resource.Quantity.Value does.
	q := new(big.Int).Quo(v.Num(), v.Denom())
	if v.Sign() > 0 && !v.IsInt() {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return 0, fmt.Errorf("quantity %q: out of range", s)
	}
	return q.Int64(), nil
}
