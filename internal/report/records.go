package report

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
)

// recordJSON is one line of WriteRecords: times in milliseconds from the start of the run.
type recordJSON struct {
	ID            string   `json:"id"`
	Policy        string   `json:"policy"`
	Endpoint      string   `json:"endpoint,omitempty"`
	ArrivalMS     float64  `json:"arrival_ms"`
	FirstTokenMS  *float64 `json:"first_token_ms,omitempty"`
	FinishMS      float64  `json:"finish_ms"`
	TTFTMS        *float64 `json:"ttft_ms,omitempty"`
	E2EMS         float64  `json:"e2e_ms"`
	PromptTokens  int      `json:"prompt_tokens"`
	CachedTokens  *int     `json:"cached_tokens"` // null: not reported
	OutputTokens  int      `json:"output_tokens"`
	PredictedHits *int     `json:"predicted_cached_tokens,omitempty"`
	Attempts      int      `json:"attempts,omitempty"`
	MovedBy       string   `json:"moved_by,omitempty"`
	Error         string   `json:"error,omitempty"`
}

// WriteRecords writes recs as JSON Lines, one object per request, times in milliseconds.
func WriteRecords(w io.Writer, recs []Record) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range recs {
		r := &recs[i]
		j := recordJSON{
			ID: r.ID, Policy: r.Policy, Endpoint: r.Endpoint,
			ArrivalMS: ms(r.Arrival), FinishMS: ms(r.Finish), E2EMS: ms(r.E2E()),
			PromptTokens: r.PromptTokens, OutputTokens: r.OutputTokens, Attempts: r.Attempts, MovedBy: r.MovedBy, Error: r.Err,
		}
		if !r.CachedUnknown {
			c := r.CachedTokens
			j.CachedTokens = &c
		}
		if r.FirstToken != 0 {
			ft, ttft := ms(r.FirstToken), ms(r.TTFT())
			j.FirstTokenMS, j.TTFTMS = &ft, &ttft
		}
		if r.Predicted {
			p := r.PredictedCachedTokens
			j.PredictedHits = &p
		}
		if err := enc.Encode(&j); err != nil {
			return fmt.Errorf("write record %s: %w", r.ID, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write records: %w", err)
	}
	return nil
}
