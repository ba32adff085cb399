package engine

import "fmt"

// CheckLists holds the posting lists of every rule index of s of both ends to
// the rules they file: each list sorted, of its class, each rule filed once
// (the index's size), and each entry's ids its rule's term ids without the
// term of its list. It returns the first difference.
func CheckLists(s *Snapshot) error {
	return checkRuleIndexes(s, func(ix *ruleIndex) bool { return ix.ends == endSrc|endDst }, checkLists)
}

func checkLists(ix *ruleIndex) error {
	seen := map[*rule]bool{}
	check := func(name string, l plist, cl int, skip idTerm) error {
		for i := range l {
			e := &l[i]
			if i > 0 && e.r.key.less(&l[i-1].r.key) {
				return fmt.Errorf("%s class %d: out of order at %d", name, cl, i)
			}
			if classOf(e.r) != cl {
				return fmt.Errorf("%s class %d: a rule of class %d", name, cl, classOf(e.r))
			}
			if seen[e.r] {
				return fmt.Errorf("%s: rule %s filed twice", name, e.r.id)
			}
			seen[e.r] = true
			want := entry(e.r, skip, ix.lookupIDs(e.r, nil))
			if *e != want {
				return fmt.Errorf("%s: rule %s: entry %+v, want %+v", name, e.r.id, *e, want)
			}
		}
		return nil
	}
	for cl, l := range ix.always {
		if err := check("always", l, cl, idTerm{}); err != nil {
			return err
		}
	}
	var err error
	ix.keys.Range(func(tk termKey, kp *keyPostings) bool {
		for cl := range 2 {
			if err = check(fmt.Sprintf("%d/%s", tk.end, tk.key), kp.presence.list(cl), cl, idTerm{kp.kid, 0}); err != nil {
				return false
			}
		}
		kp.exact.Range(func(v string, p postings) bool {
			for cl := range 2 {
				if err = check(fmt.Sprintf("%d/%s=%s", tk.end, tk.key, v), p.list(cl), cl, idTerm{kp.kid, p.vid}); err != nil {
					return false
				}
			}
			return true
		})
		return err == nil
	})
	if err != nil {
		return err
	}
	if len(seen) != ix.size {
		return fmt.Errorf("%d rules filed, size %d", len(seen), ix.size)
	}
	return checkDF(ix, seen)
}

// checkDF holds every term's df, with its pending change, to the rules that
// carry it; a term no rule carries may stay only while its change is pending.
func checkDF(ix *ruleIndex, rules map[*rule]bool) error {
	want := map[term]int32{}
	var buf [8]term
	for r := range rules {
		for _, t := range ix.terms(r, buf[:0]) {
			want[t]++
		}
	}
	var err error
	ix.keys.Range(func(tk termKey, kp *keyPostings) bool {
		pt := term{end: tk.end, key: tk.key, presence: true}
		if kp.presence.df != want[pt] {
			err = fmt.Errorf("%v: df %d, %d rules carry it", pt, kp.presence.df, want[pt])
			return false
		}
		delete(want, pt)
		if len(kp.pend) > pendMax {
			err = fmt.Errorf("%d/%s: %d pending changes", tk.end, tk.key, len(kp.pend))
			return false
		}
		for _, x := range kp.pend {
			if _, ok := kp.exact.Get(x.v); !ok || x.d == 0 {
				err = fmt.Errorf("%d/%s=%s: a pending change %d of no term", tk.end, tk.key, x.v, x.d)
				return false
			}
		}
		kp.exact.Range(func(v string, p postings) bool {
			t := term{end: tk.end, key: tk.key, value: v}
			df := p.df + kp.pending(v)
			switch {
			case df != want[t]:
				err = fmt.Errorf("%v: df %d (%d pending), %d rules carry it", t, df, kp.pending(v), want[t])
			case df == 0 && (kp.pending(v) == 0 || !p.empty()):
				err = fmt.Errorf("%v: no rule carries it, yet it stays", t)
			}
			delete(want, t)
			return err == nil
		})
		return err == nil
	})
	if err != nil {
		return err
	}
	for t, n := range want {
		if t.end != 0 && n > 0 {
			return fmt.Errorf("%v: carried by %d rules, no entry", t, n)
		}
	}
	return nil
}
