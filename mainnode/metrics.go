package mainnode

import (
	"github.com/odmoe/odmoe/internal/metricnames"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// ExpertBytes is the size of one expert of a model with config c, as the
// store keeps and a worker reads it: its three matrices (w1, w3: hidden x
// intermediate, w2: intermediate x hidden) in the checkpoint's dtype,
// BF16 unless config.json says float32.
func ExpertBytes(c model.Config) int64 {
	size := int64(2)
	if c.TorchDType == "float32" {
		size = 4
	}
	return 3 * int64(c.HiddenSize) * int64(c.IntermediateSize) * size
}

// workerCounts sum what one worker's results say it did; the link's
// receive loop adds each result, a scrape reads them.
type workerCounts struct {
	results, loads, misses     atomic.Int64
	loadNs, computeNs, stallNs atomic.Int64
	late, wrong                atomic.Int64 // misses in layers with a prediction, by cause (the swarm scores them)
	rejoins                    atomic.Int64 // times it came back into the layout after it was lost
}

// figures are c on the wire (a main stage's, StageFigures.Workers).
func (c *workerCounts) figures() wire.WorkerFigures {
	return wire.WorkerFigures{Results: c.results.Load(), Loads: c.loads.Load(), Misses: c.misses.Load(), Late: c.late.Load(), Wrong: c.wrong.Load(),
		LoadNs: c.loadNs.Load(), ComputeNs: c.computeNs.Load(), StallNs: c.stallNs.Load()}
}

func (c *workerCounts) add(r *wire.ExpertResult) {
	c.results.Add(1)
	if r.Loaded {
		c.loads.Add(1)
		c.loadNs.Add(int64(r.LoadTime))
	}
	if r.Miss {
		c.misses.Add(1)
	}
	c.computeNs.Add(int64(r.ComputeTime))
	c.stallNs.Add(int64(r.StallTime))
}

// recallCounts are OD-MoE eq. (3)'s numerator and denominator as
// counters: over the decode layers scored, the experts activated that
// were predicted, and the experts activated. Once each token's every
// layer is scored, predicted/routed is eq. (3): sum c(q,n,l) over
// k L sum A(q,n).
type recallCounts struct{ predicted, routed int64 }

// add counts one layer's activations and those of them predicted, and
// returns the latter.
func (c *recallCounts) add(pred, actual []int) (predicted int) {
	for _, e := range actual {
		if slices.Contains(pred, e) {
			predicted++
		}
	}
	c.predicted += int64(predicted)
	c.routed += int64(len(actual))
	return predicted
}

func newDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	descExpertLoads  = newDesc(metricnames.ExpertLoadsTotal, "Experts a worker loaded for this node's requests (their first user).", "phase")
	descExpertMisses = newDesc(metricnames.ExpertMissesTotal, "Experts loaded on demand: not loaded, nor loading, when their activation arrived. cause: late (predicted too late), wrong (not predicted), unscored (no shadow prediction).", "phase", "cause")
	descLayerPasses  = newDesc(metricnames.LayerPassesTotal, "Layers whose experts ran on the workers.", "phase")
	descLayerResults = newDesc(metricnames.LayerExpertResultsTotal, "Expert results the layers' passes received: one per expert a pass activated (a batched pass's rows share each).", "phase")
	descLayerMain    = newDesc(metricnames.LayerMainSecondsTotal, "Main-node compute before each layer's experts (attention, router).", "phase")
	descLayerExperts = newDesc(metricnames.LayerExpertsSecondsTotal, "From sending a layer's activations to its last expert result.", "phase")
	descLayerNetwork = newDesc(metricnames.LayerNetworkSecondsTotal, "Layer expert time less the slowest request's time on its worker.", "phase")
	descLayerStall   = newDesc(metricnames.LayerStallSecondsTotal, "The slowest request's wait for its expert to load, per layer.", "phase")

	descWorkerUp        = newDesc(metricnames.WorkerUp, "Whether the connection to the worker is live (1) or lost (0).", "worker")
	descWorkerFilling   = newDesc(metricnames.WorkerFilling, "Whether the worker is back but still filling its share of the store (1): out of the layout until its share is in.", "worker")
	descWorkerResults   = newDesc(metricnames.WorkerResultsTotal, "Expert results received from the worker.", "worker")
	descWorkerLoads     = newDesc(metricnames.WorkerLoadsTotal, "Experts the worker loaded for this node's requests.", "worker")
	descWorkerBytes     = newDesc(metricnames.WorkerLoadBytesTotal, "Bytes of the experts the worker loaded for this node's requests.", "worker")
	descWorkerMisses    = newDesc(metricnames.WorkerMissesTotal, "Experts the worker loaded on demand for this node's requests.", "worker")
	descWorkerLoad      = newDesc(metricnames.WorkerLoadSecondsTotal, "Time the worker spent loading experts for this node's requests.", "worker")
	descWorkerCompute   = newDesc(metricnames.WorkerComputeSecondsTotal, "Time the worker spent computing experts for this node's requests.", "worker")
	descWorkerStall     = newDesc(metricnames.WorkerStallSecondsTotal, "Time this node's requests waited on the worker for their expert to load.", "worker")
	descWorkerDevice    = newDesc(metricnames.WorkerDeviceBytes, "Device memory the worker holds now, as it last answered (asked every second while serving).", "worker")
	descWorkerBudget    = newDesc(metricnames.WorkerDeviceBudgetBytes, "The worker's device memory budget (its -device-mem).", "worker")
	descWorkerMissCause = newDesc(metricnames.WorkerPredictedMissesTotal, "Misses on the worker in layers that had a shadow prediction: late (predicted, not loaded in time) or wrong (not predicted).", "worker", "cause")
	descWorkerRejoins   = newDesc(metricnames.WorkerRejoinsTotal, "Times the worker came back into the layout after it was lost.", "worker")
	descWorkerInfo      = newDesc(metricnames.WorkerInfo, "1 for each worker, labelled with the address of its current connection.", "worker", "addr")
	descWorkerResident  = newDesc(metricnames.WorkerResidentExperts, "Experts the worker keeps resident now, as it last answered.", "worker")
	descWorkerFetched   = newDesc(metricnames.WorkerStoreFetchedBytes, "Bytes of the expert store the worker fetched from other nodes since it started (its -fetch-from: chunks its -store lacked), as it last answered.", "worker")
	descWorkerServed    = newDesc(metricnames.WorkerStoreServedBytes, "Bytes of its expert store the worker served to nodes fetching their share (odmoe fetch, -fetch-from) since it started, as it last answered.", "worker")

	descStoreServed     = newDesc(metricnames.StoreServedBytesTotal, "Bytes of the model's checkpoint and expert store this node served to nodes fetching their share (-store-listen).")
	descWorkersLost     = newDesc(metricnames.WorkersLostTotal, "Worker connections that ended.")
	descWorkersRejoined = newDesc(metricnames.WorkersRejoinedTotal, "Lost workers that came back into the layout.")
	descResent          = newDesc(metricnames.RequestsResentTotal, "Expert requests re-sent to another worker after theirs was lost.")

	descShadowUp         = newDesc(metricnames.ShadowUp, "Whether the shadow is connected and predicting (1) or lost (0).")
	descShadowPredicted  = newDesc(metricnames.ShadowPredictedExpertsTotal, "Experts activated in decode layers that the shadow had predicted (OD-MoE eq. 3's numerator).")
	descShadowRouted     = newDesc(metricnames.ShadowRoutedExpertsTotal, "Experts activated in the decode layers scored against a shadow prediction (eq. 3's denominator).")
	descShadowLost       = newDesc(metricnames.ShadowLostTotal, "Times the shadow's connection ended.")
	descShadowReattached = newDesc(metricnames.ShadowReattachedTotal, "Times a lost shadow came back and was re-aligned.")
	descShadowReused     = newDesc(metricnames.ShadowCachedTokensTotal, "Prompt tokens whose KV rows the shadow copied from its prefix cache instead of running them.")
	descReactive         = newDesc(metricnames.ReactivePassesTotal, "Decode passes run without the shadow, loading reactively.")
	descShadowGuesses    = newDesc(metricnames.ShadowGuessesTotal, "The shadow's guesses of a member's next token on the passes it ran ahead, by the kind of request (greedy; sampled: a temperature, penalties or biases, guessed with the request's own seeded draw; constrained: a grammar, guessed inside it) and outcome: met (the main node fed that token: the pass's predictions stand) or rewound (it fed another; the shadow ran the row again).", "kind", "outcome")
	descShadowAhead      = newDesc(metricnames.ShadowAheadPassesTotal, "Decode passes the shadow ran ahead of its alignment on the tokens it sampled itself (speculative departure).")
	descShadowAlignToken = newDesc(metricnames.ShadowAlignTokenPeriod, "Passes between the shadow's token alignments (T): the policy it has run the most decode steps under (with -align-adaptive its choices change).")
	descShadowAlignKV    = newDesc(metricnames.ShadowAlignKvPeriod, "Passes between the shadow's KV alignments (K), of the same policy.")
)

// Collector returns the swarm's Prometheus metrics, for GET /metrics
// beside the API's own (serve/metrics.go); expertBytes is one expert's
// size (ExpertBytes), which turns loads into bytes. A scrape reads
// counters the main node keeps anyway, under the Swarm's locks: it sends
// no message. Label values are bounded: phase is prefill or decode,
// worker a worker's name, cause one of three.
//
// What the layers cost this node (Stats, summed over the layers):
//
//	odmoe_expert_loads_total{phase}          experts a worker loaded for this node's requests (their first
//	                                         user; a hinted load evicted unused is not one)
//	odmoe_expert_misses_total{phase,cause}   experts not loaded, nor loading, when their activation arrived:
//	                                         loaded on demand. cause: late (the shadow predicted it, too late),
//	                                         wrong (the shadow did not predict it), unscored (no shadow
//	                                         prediction: prefill, reactive loading, the other -prefetch policies)
//	odmoe_layer_passes_total{phase}          layers run on the workers (each layer of each forward pass)
//	odmoe_layer_expert_results_total{phase}  expert results those layers received (experts activated)
//	odmoe_layer_main_seconds_total{phase}    main-node compute before the layers' experts (t_M: attention, router)
//	odmoe_layer_experts_seconds_total{phase} from sending a layer's activations to its last result
//	odmoe_layer_network_seconds_total{phase} that, less the slowest request's time on its worker
//	odmoe_layer_stall_seconds_total{phase}   the slowest request's wait for its expert to load
//
// Per worker (worker="w1", ...), from every result it sent:
//
//	odmoe_worker_up{worker}                    1 while its connection is live, 0 while it is lost
//	odmoe_worker_filling{worker}               1 while it is back but filling its share of the store
//	                                           (out of the layout until its share is in), else 0
//	odmoe_worker_info{worker,addr}             1, the address of its current connection as a label
//	odmoe_worker_rejoins_total{worker}         times it came back into the layout after it was lost
//	odmoe_worker_predicted_misses_total{worker,cause} its misses in layers with a shadow prediction:
//	                                           late or wrong (odmoe_expert_misses_total's split, per worker)
//	odmoe_worker_results_total{worker}         expert results received
//	odmoe_worker_loads_total{worker}           experts it loaded for them (as odmoe_expert_loads_total)
//	odmoe_worker_load_bytes_total{worker}      the bytes of those loads (loads x expertBytes)
//	odmoe_worker_misses_total{worker}          of them, the ones loaded on demand
//	odmoe_worker_load_seconds_total{worker}    loading them
//	odmoe_worker_compute_seconds_total{worker} computing experts
//	odmoe_worker_stall_seconds_total{worker}   requests waiting for their expert to load
//	odmoe_worker_device_bytes{worker}          device memory it holds now    } as it last answered
//	odmoe_worker_device_budget_bytes{worker}   its device memory budget      } PollWorkers (every
//	odmoe_worker_resident_experts{worker}      experts it keeps resident now } second while serving)
//
// Faults (FaultStats):
//
//	odmoe_workers_lost_total     worker connections that ended
//	odmoe_workers_rejoined_total lost workers that came back
//	odmoe_requests_resent_total  requests re-sent to another worker after theirs was lost
//
// With a shadow (-prefetch shadow) only:
//
//	odmoe_shadow_up                      1 while the shadow is connected and predicting, else 0
//	odmoe_shadow_predicted_experts_total experts activated in decode layers that the shadow had predicted
//	odmoe_shadow_routed_experts_total    experts activated in the decode layers scored against a prediction:
//	                                     predicted/routed is OD-MoE eq. (3) (a batched pass counts the union
//	                                     of its rows' experts, as ShadowStats.Recall does)
//	odmoe_shadow_lost_total              times the shadow's connection ended
//	odmoe_shadow_reattached_total        times a lost shadow came back
//	odmoe_shadow_cached_tokens_total     prompt tokens the shadow reused from its prefix cache
//	odmoe_reactive_iterations_total      decode passes run without the shadow, loading reactively
//	odmoe_shadow_ahead_passes_total      decode passes the shadow ran ahead of its alignment (speculative departure)
//	odmoe_shadow_guesses_total{kind,outcome} its guesses of members' tokens on those passes, by kind of
//	                                     request (greedy, sampled, constrained): met or rewound
//	odmoe_shadow_align_token_period      the alignment periods T and K of the policy the shadow has
//	odmoe_shadow_align_kv_period         run the most decode steps under
func (s *Swarm) Collector(expertBytes int64) prometheus.Collector {
	return &swarmCollector{s: s, expertBytes: expertBytes}
}

type swarmCollector struct {
	s           *Swarm
	expertBytes int64
}

func (c *swarmCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descExpertLoads, descExpertMisses, descLayerPasses, descLayerResults, descLayerMain, descLayerExperts,
		descLayerNetwork, descLayerStall, descWorkerUp, descWorkerFilling, descWorkerResults, descWorkerLoads, descWorkerBytes, descWorkerMisses,
		descWorkerLoad, descWorkerCompute, descWorkerStall, descWorkersLost, descWorkersRejoined, descResent,
		descWorkerDevice, descWorkerBudget, descWorkerResident, descWorkerFetched, descWorkerServed, descWorkerInfo, descWorkerMissCause, descWorkerRejoins} {
		ch <- d
	}
	if c.s.opt.StoreServed != nil {
		ch <- descStoreServed
	}
	if c.s.shadow != nil {
		for _, d := range []*prometheus.Desc{descShadowUp, descShadowPredicted, descShadowRouted, descShadowLost, descShadowReattached, descShadowReused, descReactive,
			descShadowAhead, descShadowGuesses, descShadowAlignToken, descShadowAlignKV} {
			ch <- d
		}
	}
}

func (c *swarmCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	// the sums, not Stats(): its copy of every pass's figures grows
	// with the node's life
	s.mu.Lock()
	phases := [2]LayerStats{Total(s.stats.Prefill), Total(s.stats.Decode)}
	faults := s.stats.Faults
	s.mu.Unlock()
	staged := make([]wire.WorkerFigures, len(s.workers)) // what each worker did for the stages' requests
	if s.opt.Stages != nil {                             // the layers its stages ran, as their last runs told
		for _, f := range s.opt.Stages.Figures() {
			for i := range f.Decode {
				phases[0].add(layerStats(f.Prefill[i]))
				phases[1].add(layerStats(f.Decode[i]))
			}
			for w := range min(len(f.Workers), len(staged)) {
				a, b := &staged[w], f.Workers[w]
				a.Results, a.Loads, a.Misses, a.Late, a.Wrong = a.Results+b.Results, a.Loads+b.Loads, a.Misses+b.Misses, a.Late+b.Late, a.Wrong+b.Wrong
				a.LoadNs, a.ComputeNs, a.StallNs = a.LoadNs+b.LoadNs, a.ComputeNs+b.ComputeNs, a.StallNs+b.StallNs
			}
		}
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	seconds := func(ns int64) float64 { return time.Duration(ns).Seconds() }
	for i, ph := range [2]string{"prefill", "decode"} {
		t := phases[i]
		counter(descExpertLoads, float64(t.Loads), ph)
		counter(descExpertMisses, float64(t.MissesLate), ph, "late")
		counter(descExpertMisses, float64(t.MissesWrong), ph, "wrong")
		counter(descExpertMisses, float64(t.Misses-t.MissesLate-t.MissesWrong), ph, "unscored")
		counter(descLayerPasses, float64(t.Calls), ph)
		counter(descLayerResults, float64(t.Results), ph)
		counter(descLayerMain, t.Main.Seconds(), ph)
		counter(descLayerExperts, t.Experts.Seconds(), ph)
		counter(descLayerNetwork, t.Network.Seconds(), ph)
		counter(descLayerStall, t.Stall.Seconds(), ph)
	}
	if s.opt.StoreServed != nil {
		counter(descStoreServed, float64(s.opt.StoreServed.Load()))
	}
	s.mu.Lock()
	polled := slices.Clone(s.polled)
	s.mu.Unlock()
	for i, l := range s.workers {
		if i < len(polled) && polled[i] != nil {
			p := polled[i]
			gauge(descWorkerDevice, float64(p.DeviceInUse), l.name)
			gauge(descWorkerBudget, float64(p.DeviceBudget), l.name)
			gauge(descWorkerResident, float64(p.ResidentExperts), l.name)
			counter(descWorkerFetched, float64(p.StoreFetched), l.name)
			counter(descWorkerServed, float64(p.StoreServed), l.name)
		}
		l.mu.Lock()
		up, filling := l.err == nil, l.shareIn != nil
		l.mu.Unlock()
		gauge(descWorkerUp, boolFloat(up), l.name)
		gauge(descWorkerFilling, boolFloat(filling), l.name)
		if p := l.conn(); p != nil {
			gauge(descWorkerInfo, 1, l.name, p.RemoteAddr().String())
		}
		n, st := l.counts.figures(), staged[i]
		counter(descWorkerResults, float64(n.Results+st.Results), l.name)
		loads := n.Loads + st.Loads
		counter(descWorkerLoads, float64(loads), l.name)
		counter(descWorkerBytes, float64(loads*c.expertBytes), l.name)
		counter(descWorkerMisses, float64(n.Misses+st.Misses), l.name)
		counter(descWorkerRejoins, float64(l.counts.rejoins.Load()), l.name)
		counter(descWorkerMissCause, float64(n.Late+st.Late), l.name, "late")
		counter(descWorkerMissCause, float64(n.Wrong+st.Wrong), l.name, "wrong")
		counter(descWorkerLoad, seconds(n.LoadNs+st.LoadNs), l.name)
		counter(descWorkerCompute, seconds(n.ComputeNs+st.ComputeNs), l.name)
		counter(descWorkerStall, seconds(n.StallNs+st.StallNs), l.name)
	}
	counter(descWorkersLost, float64(faults.WorkersLost))
	counter(descWorkersRejoined, float64(faults.Rejoins))
	counter(descResent, float64(faults.Resent))
	if sl := s.shadow; sl != nil {
		sl.mu.Lock()
		up, rc, reused, ahead, guesses, policy := sl.up, sl.counts, sl.reused, sl.ahead, maps.Clone(sl.guesses), sl.chosenLocked()
		sl.mu.Unlock()
		gauge(descShadowUp, boolFloat(up))
		counter(descShadowPredicted, float64(rc.predicted))
		counter(descShadowRouted, float64(rc.routed))
		counter(descShadowLost, float64(faults.ShadowLost))
		counter(descShadowReattached, float64(faults.ShadowReattached))
		counter(descShadowReused, float64(reused))
		counter(descReactive, float64(faults.ReactivePasses))
		counter(descShadowAhead, float64(ahead))
		for _, k := range []string{KindGreedy, KindSampled, KindConstrained} {
			counter(descShadowGuesses, float64(guesses[k].Met), k, "met")
			counter(descShadowGuesses, float64(guesses[k].Rewound), k, "rewound")
		}
		gauge(descShadowAlignToken, float64(policy.TokenPeriod))
		gauge(descShadowAlignKV, float64(policy.KVPeriod))
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
