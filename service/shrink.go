package service

// Go's maps and slices keep the memory of the most they ever held: a map
// whose keys were deleted, or a slice resliced from its front, still holds
// its peak's storage. What the service keeps per name is sized by what is
// held now, so the structures that a churn of names grows are made anew
// once they have shrunk well below their peak (shrinkMap, shrinkSlice);
// each check costs nothing until then, and a rebuild is paid for by the
// deletes that made it due.

// minShrink is the size below which nothing is rebuilt: small structures
// cost less than their rebuilds.
const minShrink = 1024

// mapPeak is the most keys a map held since it was last made.
type mapPeak int

// note notes that the map holds n keys.
func (p *mapPeak) note(n int) {
	if n > int(*p) {
		*p = mapPeak(n)
	}
}

// shrinkMap returns m, or a copy of it in storage of its own size when it
// holds less than a quarter of its peak p.
func shrinkMap[K comparable, V any](m map[K]V, p *mapPeak) map[K]V {
	if int(*p) < minShrink || len(m) > int(*p)/4 {
		return m
	}
	fresh := make(map[K]V, len(m))
	for k, v := range m {
		fresh[k] = v
	}
	*p = mapPeak(len(fresh))
	return fresh
}

// shrinkSlice returns s, or a copy of it in storage of its own size when
// it fills less than a quarter of its capacity (nil when empty: a slice
// resliced to nothing still holds its whole array).
func shrinkSlice[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	if cap(s) < minShrink || len(s) > cap(s)/4 {
		return s
	}
	return append(make([]T, 0, len(s)), s...)
}
