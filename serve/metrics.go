package serve

import (
	"github.com/odmoe/odmoe/internal/metricnames"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the API's own figures; the node adds its swarm's (loads,
// stalls, recall, workers up) to the same registry.
type metrics struct {
	requests         *prometheus.CounterVec
	promptTokens     prometheus.Counter
	prefixHits       prometheus.Counter
	cachedTokens     prometheus.Counter
	generatedTokens  prometheus.Counter
	timeToFirstToken prometheus.Histogram
	interToken       prometheus.Histogram
	// a request's own share of a swarm's figures (GenerateStats.Experts)
	requestRecall prometheus.Histogram
	requestMisses prometheus.Histogram
	// drafting: the guesses requests' passes checked and kept, and their
	// decode passes (each gave a token and the guesses it kept)
	draftGuesses, draftAccepted, decodePasses prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, a *admission) *metrics {
	latency := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricnames.RequestsTotal, Help: "API requests answered, by endpoint and HTTP status.",
		}, []string{"endpoint", "status"}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricnames.PromptTokensTotal, Help: "Prompt tokens of the requests that generated.",
		}),
		prefixHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricnames.PrefixCacheHitsTotal, Help: "Requests whose prompt started with tokens whose KV rows the prefix cache held: reused, not computed.",
		}),
		cachedTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricnames.PromptCachedTokensTotal, Help: "Prompt tokens whose KV rows came from the prefix cache (usage.prompt_tokens_details.cached_tokens).",
		}),
		generatedTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricnames.GeneratedTokensTotal, Help: "Tokens generated.",
		}),
		timeToFirstToken: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: metricnames.TimeToFirstTokenSeconds, Help: "From a request's arrival (queueing included) to its first generated token.",
			Buckets: latency,
		}),
		interToken: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: metricnames.InterTokenLatencySeconds, Help: "Between consecutive generated tokens of a sequence.",
			Buckets: latency,
		}),
		requestRecall: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: metricnames.RequestShadowRecall, Help: "A request's share of its decode rows' routed experts that the shadow had predicted (OD-MoE eq. 3 over its own tokens), on a swarm with a shadow.",
			Buckets: []float64{.5, .6, .7, .8, .9, .95, .98, .99, 1},
		}),
		requestMisses: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: metricnames.RequestExpertMissesPerStep, Help: "A request's decode rows' experts loaded on demand while the row waited, over its decode steps, on a swarm.",
			Buckets: []float64{0, .01, .02, .05, .1, .2, .5, 1, 2, 5},
		}),
		draftGuesses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricnames.DraftGuessesTotal, Help: "Guessed tokens (the shadow's, -draft) that requests' decode passes checked after their last token.",
		}),
		draftAccepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricnames.DraftAcceptedTotal, Help: "Guessed tokens kept: each is a token generated without a pass of its own.",
		}),
		decodePasses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricnames.DecodePassesTotal, Help: "Requests' decode passes (after the prompt's): tokens per pass = (decode passes + guesses kept) / decode passes.",
		}),
	}
	reg.MustRegister(m.requests, m.draftGuesses, m.draftAccepted, m.decodePasses, m.promptTokens, m.prefixHits, m.cachedTokens, m.generatedTokens, m.timeToFirstToken, m.interToken,
		m.requestRecall, m.requestMisses,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: metricnames.RequestsWaiting, Help: "Requests queued for a place in the batch.",
		}, func() float64 { return float64(a.waits.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: metricnames.BatchSize, Help: "Sequences generating now.",
		}, func() float64 { return float64(a.running.Load()) }),
	)
	return m
}
