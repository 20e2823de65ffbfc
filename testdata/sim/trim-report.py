# trims a bench rig report.json to what odmoe sim calibrate and validate
# read: python3 trim-report.py SRC DST CASE MODEL (CASE: the calibration
# case, e.g. p16-o256; MODEL: the config directory the trimmed report names)
import json, sys
src, dst, cal, model = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
r = json.load(open(src))
def stats(s, iters):
    keep = {k: s[k] for k in ('decode_tokens_per_s', 'ttft_ms', 'decode_layers', 'prefill_layers', 'recall', 'decode_cpu_s') if k in s}
    if iters and 'iterations' in s:
        keep['iterations'] = [{k: i[k] for k in ('layer', 'calls', 'main_ms')} for i in s['iterations']]
    return keep
def run(x, deep):
    y = {k: x[k] for k in ('mode', 'case', 'prompt_tokens', 'output_tokens', 'identical', 'cpu_busy', 'cpu_s', 'wall_s', 'decode_tokens_per_s_runs') if k in x}
    y['stats'] = stats(x['stats'], deep and x['mode'] == 'resident')
    if 'repeats' in x:
        # every repeat's TTFT (validate compares the median); the
        # calibration case's resident, reactive and shadow runs whole
        y['repeats'] = [run(z, True) if deep else {'stats': {'ttft_ms': z['stats']['ttft_ms']}} for z in x['repeats']]
    return y
# the resident runs whole at every length too: calibration reads a prompt
# layer's parts from two lengths
r['runs'] = [run(x, x['case'] == cal and x['mode'] in ('resident', 'shadow', 'reactive') or x['mode'] == 'resident') for x in r['runs']]
r['model'] = model
json.dump(r, open(dst, 'w'), indent=1)
