package route

// ApplyBatch applies a message's events in order, as Apply does one by one, and tells dropped
// (if not nil) why of each it did not apply. The clock is read, and the attempts whose TTL ran
// out are ended, once for the whole batch rather than once per event: a peer's stream applies
// its events batch by batch. It keeps the events' Blocks.
func (lc *Lifecycle) ApplyBatch(evs []Event, dropped func(Drop)) {
	s := lc.share
	if s == nil {
		for range evs {
			if dropped != nil {
				dropped(DropInvalid)
			}
		}
		return
	}
	now := s.cfg.Clock.Now()
	s.expire(now)
	for i := range evs {
		if d := s.count(s.apply(lc, &evs[i], now)); d != DropNone && dropped != nil {
			dropped(d)
		}
	}
}
