package etcd

// ApplyReads is how many reads Apply made before its transactions.
func (s *Store) ApplyReads() int64 { return s.reads.Load() }
