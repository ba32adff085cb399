package resource

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"unicode/utf8"
)

// Limits on documents and requests. They keep one resource well inside etcd's
// 1.5 MiB request limit and bound the work a single request can cause.
const (
	MaxNameLength          = 253
	MaxTagKeyLength        = 317 // a Kubernetes label key: 253-byte prefix, '/', 63-byte name
	MaxTagValueLength      = 1024
	MaxTagsPerWorkload     = 64
	MaxTagsPerSelector     = 64
	MaxSelectors           = 256
	MaxValuesPerExpression = 256
	MaxPortEntries         = 64
	MaxPortRanges          = 256
	MaxItems               = 1024
	MaxResourceBytes       = 1 << 20
	MaxWhenLength          = 4096
)

func CheckName(s string) error {
	if s == "" {
		return errors.New("must not be empty")
	}
	if s == "." || s == ".." {
		return fmt.Errorf("%q is not a name: '.' and '..' are path steps", s)
	}
	if len(s) > MaxNameLength {
		return fmt.Errorf("is %d characters, over the limit of %d", len(s), MaxNameLength)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return fmt.Errorf("%q has %q: names use only letters, digits, '.', '_', ':' and '-'", s, string(rune(c)))
		}
	}
	return nil
}

func checkTagKey(k string) error {
	if k == "" {
		return errors.New(`key "" is empty`)
	}
	if len(k) > MaxTagKeyLength {
		return fmt.Errorf("key of %d bytes is over the limit of %d", len(k), MaxTagKeyLength)
	}
	if !utf8.ValidString(k) {
		return fmt.Errorf("key %q is not valid UTF-8", k)
	}
	if err := checkControl(k); err != nil {
		return fmt.Errorf("key %q %w", k, err)
	}
	return nil
}

func CheckTagValue(v string, wildcard bool) error {
	if v == "" {
		if wildcard {
			return errors.New("value is empty (use '*' for any value)")
		}
		return errors.New("value is empty")
	}
	if len(v) > MaxTagValueLength {
		return fmt.Errorf("value of %d bytes is over the limit of %d", len(v), MaxTagValueLength)
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("value %q is not valid UTF-8", v)
	}
	if err := checkControl(v); err != nil {
		return fmt.Errorf("value %q %w", v, err)
	}
	return nil
}

// checkControl refuses the control characters U+0000–U+001F and U+007F. With
// none in a tag's key or value, the identity's encoding (key, 0, value, 0 per
// pair) reads back one way only, so two distinct tag sets never share the
// bytes an identity is hashed from (docs/workloads.md, "Identities").
func checkControl(s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return &controlError{c: c, at: i}
		}
	}
	return nil
}

// controlError is a control character found in a tag (checkControl).
type controlError struct {
	c  byte
	at int
}

func (e *controlError) Error() string {
	return fmt.Sprintf("has the control character U+%04X at byte %d: control characters (U+0000 to U+001F, U+007F) are refused in tags", e.c, e.at)
}

// CheckTags validates a workload's tags as a request carries them.
func CheckTags(tags map[string]string) error {
	if len(tags) > MaxTagsPerWorkload {
		return fmt.Errorf("%d tags, over the limit of %d", len(tags), MaxTagsPerWorkload)
	}
	for k, v := range tags {
		if err := checkTagKey(k); err != nil {
			return err
		}
		if len(v) > MaxTagValueLength {
			return fmt.Errorf("tag %q: value of %d bytes is over the limit of %d", k, len(v), MaxTagValueLength)
		}
		if !utf8.ValidString(v) {
			return fmt.Errorf("tag %q: value is not valid UTF-8", k)
		}
		if err := checkControl(v); err != nil {
			return fmt.Errorf("tag %q: value %w", k, err)
		}
	}
	return nil
}

func ParseCIDR(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR or an IP address", s)
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR (%v)", s, err)
	}
	return p.Masked(), nil
}
