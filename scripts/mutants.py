"""Mutation spot-check: apply small plausible bugs one at a time and check the named tests catch each.

Each mutant is (name, file, original text, mutated text, tests); the texts may instead be tuples of
several edits applied together (one bug spread over lines, e.g. a guard checked in two places). Each
original text must occur in the file exactly once, or the number of times given as a third element
(then every occurrence is mutated). The file is restored after every run, also on Ctrl-C. Exit status 1
when a mutant survives (its tests still pass). Run: ``bash scripts/mutation.sh --spot`` (all) or
``--spot NAME-SUBSTRING`` (those whose name contains it).
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MUTANTS = [
    ("unpickler admits every builtins global", "memlens/io/safe_pickle.py",
     "        if (module, name) in _ALLOWED_GLOBALS:",
     "        if module == \"builtins\" or (module, name) in _ALLOWED_GLOBALS:",
     ["tests/unit/test_mutants.py::test_no_builtin_callable_is_admitted"]),
    ("unpickler admits bytearray again", "memlens/io/safe_pickle.py",
     "(\"builtins\", \"complex\"),",
     "(\"builtins\", \"complex\"), (\"builtins\", \"bytearray\"),",
     ["tests/unit/test_hostile_input.py::test_bytearray_global_is_refused"]),
    ("memo index may skip ahead", "memlens/io/safe_pickle.py",
     "                    if index > filled:",
     "                    if index > filled + (1 << 30):",
     ["tests/unit/test_hostile_input.py::test_huge_long_binput_memo_index_is_refused",
      "tests/unit/test_hostile_input.py::test_mutated_real_pickle_memo_index_is_refused"]),
    ("decompression limit off by a factor", "memlens/io/gzipfile.py",
     "                if total > limit:",
     "                if total > limit * 64:",
     ["tests/unit/test_hostile_input.py::test_limit_variable_raises_the_limit"]),
    ("frames cap ignored by the interner", "memlens/io/snapshot/frames.py",
     "        if len(frames) > self.max_frames:",
     "        if len(frames) > self.max_frames * 1000:",
     ["tests/unit/test_hostile_input.py::test_frames_limit_can_be_raised",
      "tests/unit/test_hostile_input.py::test_frames_limit_holds_for_in_memory_snapshots"]),
    ("validator skips the next live buffer", "memlens/plan/_validate_kernel.py",
     "        if pos < count and offset[live[pos]] < o + size[b] and k < limit:",
     "        if False:",
     ["tests/unit/test_mutants.py::test_validator_catches_an_overlap_only_the_next_live_buffer_shows"]),
    ("validator skips alignment", "memlens/plan/validate.py",
     "np.flatnonzero(offsets % problem.alignment != 0)",
     "np.flatnonzero(offsets < -1)",
     ["tests/unit/test_mutants.py::test_validator_checks_alignment"]),
    ("'<' left raw in script JSON", "memlens/reporting/markup.py",
     "obj_json.replace(\"<\", \"\\\\u003c\")",
     "obj_json",
     ["tests/unit/test_mutants.py::test_script_json_cannot_end_the_element"]),
    ("report shows the median as p90", "memlens/reporting/sections/access.py",
     "f\"{ns_text(st['p90_ns'])}, 99th",
     "f\"{ns_text(st['p50_ns'])}, 99th",
     ["tests/unit/test_mutants.py::test_report_ati_percentiles_are_the_real_ones"]),
    ("negative sizes accepted", "memlens/trace/checks.py",
     "        if (values < 0).any():",
     "        if (values < -(1 << 40)).any():",
     ["tests/integration/test_hostile_store.py::test_snapshot_values_out_of_range"]),
    ("checksum before the size check", "memlens/trace/read.py",
     "        check_table_file(fpath, info, mpath, verify_checksums)\n",
     "",
     ["tests/integration/test_hostile_store.py::test_sparse_terabyte_table_is_refused_without_hashing",
      "tests/integration/test_hostile_store.py::test_load_trace_checks_sizes_before_hashing"]),
    ("bool accepted as schema version", "memlens/trace/read.py",
     "    if isinstance(version, bool) or not isinstance(version, int)",
     "    if not isinstance(version, int)",
     ["tests/integration/test_hostile_store.py::test_schema_version_of_the_wrong_type",
      "tests/integration/test_hostile_store.py::test_load_trace_refuses_a_boolean_schema_version"]),
    ("option sizes unbounded", "memlens/units.py",
     "    if value >= MAX_BYTES:\n        raise InputError(f\"size",
     "    if value >= MAX_BYTES * 1024:\n        raise InputError(f\"size",
     ["tests/unit/test_hostile_cli.py::test_option_helpers_values"]),
    # ---- mutants the issue listed as surviving the suite, and weak tests rewritten
    ("swap stall guard removed", "memlens/swap/optimise.py",
     ("        if max_stall is not None and stall > max_stall:", ("if s2 <= stall and p2 <= peak", 3)),
     ("        if False:", "if p2 <= peak"),
     ["tests/unit/test_mutants.py::test_swap_plans_never_trade_stall_for_a_lower_peak"]),
    ("GC spares a block of exactly the mean age", "memlens/simulate/caching.py",
     "clock - block.gc_base < mean_age:", "clock - block.gc_base <= mean_age:",
     ["tests/unit/test_simulate_rules.py::test_garbage_collection_frees_a_block_of_exactly_the_mean_age"]),
    ("a block of exactly max_split_size serves smaller requests", "memlens/simulate/caching.py",
     "if size < max_split and block.size >= max_split:", "if size < max_split and block.size > max_split:",
     ["tests/unit/test_simulate_rules.py::test_a_block_of_exactly_max_split_size_is_oversize_for_a_smaller_request"]),
    ("a request of exactly max_split_size rounds up without bound", "memlens/simulate/caching.py",
     "            if size >= max_split and block.size", "            if size > max_split and block.size",
     ["tests/unit/test_simulate_rules.py::test_a_request_of_exactly_max_split_size_is_not_split_and_rounds_up_by_less_than_20mib"]),
    ("oversize reuse allowed at exactly size + 20 MiB", "memlens/simulate/caching.py",
     "block.size >= size + self.config.max_non_split_rounding_size:",
     "block.size > size + self.config.max_non_split_rounding_size:",
     ["tests/unit/test_simulate_rules.py::test_a_request_of_exactly_max_split_size_is_not_split_and_rounds_up_by_less_than_20mib"]),
    ("a request of exactly max_split_size is split", "memlens/simulate/caching.py",
     "return size < self._max_split and remaining", "return size <= self._max_split and remaining",
     ["tests/unit/test_simulate_rules.py::test_a_request_of_exactly_max_split_size_is_not_split_and_rounds_up_by_less_than_20mib"]),
    ("a large remainder of exactly 1 MiB is split", "memlens/simulate/caching.py",
     "remaining > K_SMALL_SIZE", "remaining >= K_SMALL_SIZE",
     ["tests/unit/test_simulate_rules.py::test_large_remainder_of_exactly_1mib_is_not_split"]),
    ("a small remainder of exactly 512 B is kept", "memlens/simulate/caching.py",
     "return remaining >= K_MIN_BLOCK", "return remaining > K_MIN_BLOCK",
     ["tests/unit/test_simulate_rules.py::test_small_remainder_of_exactly_512_bytes_is_split"]),
    ("OOM path spares blocks of exactly max_split_size", "memlens/simulate/caching.py",
     "            if block.size < max_split:\n                break",
     "            if block.size <= max_split:\n                break",
     ["tests/unit/test_simulate_rules.py::test_oom_path_releases_blocks_of_exactly_max_split_size_first"]),
    ("warm start splits off a gap of exactly 1 MiB", "memlens/simulate/warmstart.py",
     "if 0 < nxt - (r.addr + size) <= K_SMALL_SIZE:", "if 0 < nxt - (r.addr + size) < K_SMALL_SIZE:",
     ["tests/unit/test_simulate_replay.py::test_warm_start_gap_of_exactly_1mib_is_the_blocks_unsplit_remainder"]),
    ("ATI skew counter counts an access at alloc", "memlens/analysis/ati_intervals.py",
     "((first_acc < start) & has_acc)", "((first_acc <= start) & has_acc)",
     ["tests/unit/test_mutants.py::test_an_access_exactly_at_alloc_or_free_is_not_skew",
      "tests/unit/test_mutants.py::test_accesses_outside_lifetime_counts_each_skewed_end"]),
    ("ATI skew counter forgets late accesses", "memlens/analysis/ati_intervals.py",
     " + ((last_acc > end) & has_acc).sum())", ")",
     ["tests/unit/test_mutants.py::test_accesses_outside_lifetime_counts_each_skewed_end"]),
    ("kernel attribution: a launch at an op's end is outside it", "memlens/gpu_activity.py",
     "while j >= 0 and ends[j] < t[i]:", "while j >= 0 and ends[j] <= t[i]:",
     ["tests/unit/test_mutants.py::test_kernel_attribution_matches_its_definition"]),
    ("kernel attribution: a launch at an op's start is outside it", "memlens/gpu_activity.py",
     "np.searchsorted(starts, t[i], side=\"right\")", "np.searchsorted(starts, t[i], side=\"left\")",
     ["tests/unit/test_mutants.py::test_kernel_attribution_matches_its_definition"]),
    ("kernel attribution ignores the launch's thread", "memlens/gpu_activity.py",
     "if tid is None or \"tid\" not in ops.columns else", "if True else",
     ["tests/unit/test_mutants.py::test_kernel_attribution_matches_its_definition"]),
    ("kernel attribution ignores External ids", "memlens/gpu_activity.py",
     "    if \"external_id\" in ops.columns and len(ops):", "    if False:",
     ["tests/unit/test_mutants.py::test_kernel_attribution_matches_its_definition"]),
    ("kernel attribution drops a lone kernel", "memlens/gpu_activity.py",
     "if len(activity) == 0 or len(launches) == 0:", "if len(activity) <= 1 or len(launches) == 0:",
     ["tests/unit/test_mutants.py::test_kernel_attribution_edge_cases"]),
    ("kernel attribution cuts off an op of exactly 10 s", "memlens/gpu_activity.py",
     "starts[j] < t[i] - 10_000_000_000", "starts[j] <= t[i] - 10_000_000_000",
     ["tests/unit/test_mutants.py::test_kernel_attribution_edge_cases"]),
    ("report ignores --bandwidth", "memlens/commands/report.py",
     ("        report_options[\"bandwidth\"] = args.bandwidth", 2), "        pass",
     ["tests/unit/test_mutants.py::test_report_uses_the_bandwidth_option"]),
    ("plan placement ignores the kept prefix", "memlens/plan/heuristics.py",
     "int(prefix) if offsets is not None else 0", "0",
     ["tests/integration/test_plan_kernels.py::test_placement_keeps_a_prefix_and_places_the_rest"]),
    ('devicetime: misaligned GEMM free on memory', 'memlens/devicetime/rules/gemm.py',
     'mem_ns = bytes_moved / (g.mem_bw * g.mem_efficiency) * 1e9 * penalty',
     'mem_ns = bytes_moved / (g.mem_bw * g.mem_efficiency) * 1e9',
     ['tests/integration/test_devicetime_rules.py::test_misaligned_gemm_pays_on_memory_too']),
    ('devicetime: alignment checked at 2 bytes', 'memlens/devicetime/rules/gemm.py',
     '* ITEMSIZE.get(d, 4)) % 16:',
     '* ITEMSIZE.get(d, 4)) % 2:',
     ['tests/integration/test_devicetime_rules.py::test_misaligned_gemm_pays_on_memory_too']),
    ('devicetime: GEMM without results is 1x1', 'memlens/devicetime/rules/gemm.py',
     '(mats[0][-2], mats[-1][-1], math.prod(mats[0][:-2])) if mats',
     '(1, 1, 1) if mats',
     ['tests/integration/test_devicetime_rules.py::test_gemm_without_results_takes_m_and_n_from_its_operands']),
    ('devicetime: no Winograd', 'memlens/devicetime/rules/gemm.py',
     'flops /= WINOGRAD_SAVING',
     'flops /= 1.0',
     ['tests/integration/test_devicetime_rules.py::test_winograd_for_3x3_stride_1_on_cuda_cores']),
    ('devicetime: Winograd on tensor cores too', 'memlens/devicetime/rules/gemm.py',
     'if not on_matrix_units and tuple(w[2:]) == (3, 3)',
     'if tuple(w[2:]) == (3, 3)',
     ['tests/integration/test_devicetime_rules.py::test_winograd_for_3x3_stride_1_on_cuda_cores']),
    ('devicetime: no channel padding', 'memlens/devicetime/rules/gemm.py',
     'channel_eff = w[1] / (math.ceil(w[1] / mma_k) * mma_k) if on_matrix_units else 1.0',
     'channel_eff = 1.0',
     ['tests/integration/test_devicetime_rules.py::test_channel_padding_to_the_mma_k']),
    ('devicetime: no layout transposes', 'memlens/devicetime/rules/gemm.py',
     '    if on_matrix_units:   # NCHW',
     '    if False:   # NCHW',
     ['tests/integration/test_devicetime_rules.py::test_fp32_convolution_runs_direct_and_bf16_on_tensor_cores']),
    ('devicetime: depthwise as a GEMM', 'memlens/devicetime/rules/gemm.py',
     'if w[1] == 1 and x[1] > 1 and w[0] % x[1] == 0:',
     'if False:',
     ['tests/integration/test_devicetime_rules.py::test_depthwise_convolution_is_memory_bound']),
    ('devicetime: conv backward always both gradients', 'memlens/devicetime/rules/gemm.py',
     'want_weight = tuple(w) in shapes or not outputs',
     'want_weight = True',
     ['tests/integration/test_devicetime_rules.py::test_convolution_backward_one_gemm_per_gradient']),
    ('devicetime: causal mask ignored', 'memlens/devicetime/rules/attention.py',
     'kv_blocks = (kv_blocks + 1) / 2.0',
     'kv_blocks = kv_blocks',
     ['tests/integration/test_devicetime_rules.py::test_causal_attention_visits_half_the_key_blocks']),
    ('devicetime: softmax row limit off by one', 'memlens/devicetime/rules/rowwise.py',
     'row > SOFTMAX_WARP_MAX',
     'row >= SOFTMAX_WARP_MAX',
     ['tests/integration/test_devicetime_rules.py::test_softmax_priced_by_row_length']),
    ('devicetime: batch norm backward three passes', 'memlens/devicetime/rules/rowwise.py',
     'passes = 5 if "backward" in n else 3',
     'passes = 3',
     ['tests/integration/test_devicetime_rules.py::test_batch_norm_streams_its_passes']),
    ('devicetime: MIOpen batch norm at the streaming rate', 'memlens/devicetime/rules/rowwise.py',
     'eff = g.mem_efficiency if g.vendor != "amd" else g.norm_efficiency',
     'eff = g.mem_efficiency',
     ['tests/integration/test_devicetime_rules.py::test_batch_norm_streams_its_passes']),
    ('devicetime: broadcast at full bandwidth', 'memlens/devicetime/rules/memory.py',
     '            ns *= 2.0',
     '            ns *= 1.0',
     ['tests/integration/test_devicetime_rules.py::test_broadcast_halves_bandwidth_of_two_byte_types']),
    ('devicetime: broadcast penalty on 4-byte types', 'memlens/devicetime/rules/memory.py',
     'if broadcast and itemsize < 4:',
     'if broadcast:',
     ['tests/integration/test_devicetime_rules.py::test_broadcast_halves_bandwidth_of_two_byte_types']),
    ('devicetime: max-pool backward streams once', 'memlens/devicetime/rules/memory.py',
     'moved = 2.0 * read + 2.0 * written',
     'moved = read + written',
     ['tests/integration/test_devicetime_rules.py::test_max_pool_backward_reads_and_writes_twice']),
    ('devicetime: host copies at the pinned rate', 'memlens/devicetime/rules/memory.py',
     'link_bytes / min(g.pageable_bw, pinned)',
     'link_bytes / pinned',
     ['tests/integration/test_devicetime_rules.py::test_host_copies_run_at_the_pageable_rate']),
    ('devicetime: host link directions swapped', 'memlens/devicetime/rules/memory.py',
     'pinned = g.host_bw[1] if direction == "h2d" else g.host_bw[0]',
     'pinned = g.host_bw[0] if direction == "h2d" else g.host_bw[1]',
     ['tests/integration/test_devicetime_rules.py::test_host_copies_run_at_the_pageable_rate']),
    ('devicetime: _unsafe_view charged', 'memlens/devicetime/rules/names.py',
     'ZERO_COST = frozenset({"aten::_unsafe_view", ',
     'ZERO_COST = frozenset({',
     ['tests/integration/test_devicetime_rules.py::test_views_and_noop_composites_launch_nothing']),
    ('devicetime: host-side ops on the GPU clock', 'memlens/devicetime/costmodel.py',
     '        if device.lower().startswith("cpu"):',
     '        if False:',
     ['tests/integration/test_devicetime_rules.py::test_host_side_ops_are_off_the_gpu_clock']),
    ('devicetime: calibrated factors not applied', 'memlens/devicetime/costmodel.py',
     'ns = float(scale[0]) * fixed + float(scale[1]) * work',
     'ns = ns',
     ['tests/integration/test_devicetime_rules.py::test_calibrated_gpu_prices_with_the_fitted_factors']),
    ('devicetime: calibrated factors swapped', 'memlens/devicetime/costmodel.py',
     'ns = float(scale[0]) * fixed + float(scale[1]) * work',
     'ns = float(scale[1]) * fixed + float(scale[0]) * work',
     ['tests/integration/test_devicetime_rules.py::test_calibrated_gpu_prices_with_the_fitted_factors']),
    ('devicetime: calibration without the pull to 1', 'memlens/devicetime/calibration.py',
     'rhs = np.array([np.sum(s * f) + RIDGE, np.sum(s * u) + RIDGE])',
     'rhs = np.array([np.sum(s * f), np.sum(s * u)])',
     ['tests/integration/test_devicetime_rules.py::test_fit_factors_closed_form']),
    ('devicetime: calibration weights unshared', 'memlens/devicetime/calibration.py',
     '    s = m / m.sum()',
     '    s = np.ones_like(m)',
     ['tests/integration/test_devicetime_rules.py::test_fit_factors_closed_form']),
    ('devicetime: strided operands at full speed', 'memlens/devicetime/rules/memory.py',
     'STRIDED_FACTOR = 1.5 ',
     'STRIDED_FACTOR = 1.0 ',
     ['tests/integration/test_devicetime_rules.py::test_non_contiguous_operands_lose_the_vectorized_path']),
    ('devicetime: cat priced as broadcast elementwise', 'memlens/devicetime/costmodel.py',
     '    if n in _OWN_INDEXING:      # its inputs',
     '    if False:      # its inputs',
     ['tests/integration/test_devicetime_rules.py::test_non_contiguous_operands_lose_the_vectorized_path']),
    ('devicetime: strides of size-1 dims checked', 'memlens/devicetime/rules/memory.py',
     'if size > 1 and stride != expected:',
     'if stride != expected:',
     ['tests/integration/test_devicetime_rules.py::test_non_contiguous_operands_lose_the_vectorized_path']),
    ('devicetime: causal flag of concrete inputs ignored', 'memlens/devicetime/rules/names.py',
     'return str(concrete_args[pos]).strip() in',
     'return False and str(concrete_args[pos]).strip() in',
     ['tests/integration/test_devicetime_rules.py::test_causal_flag_read_from_an_imported_traces_scalar_arguments']),
    # imported profiles keep their facts and kernels; one clock contract
    ("kineto import: nested ops not summed into their parents", "memlens/io/kineto/kernels.py",
     "    for d in range(int(depth.max()) if len(depth) else 0, 0, -1):", "    for d in range(0):",
     ['tests/integration/test_import_kineto_facts.py::test_hand_made_kernels_per_op_and_the_measured_clock']),
    ("kineto import: External ids ignored", "memlens/gpu_activity.py",
     "    valid = op_external_id >= 0\n", "    valid = op_external_id < -1\n",
     ['tests/integration/test_import_kineto_facts.py::test_an_external_id_decides_over_the_enclosing_op']),
    ("kineto import: a kernel without its launch still counted as launched", "memlens/io/kineto/kernels.py",
     "    launched = (pos >= 0) & (corr >= 0)", "    launched = corr >= 0",
     ['tests/integration/test_import_kineto_facts.py::test_hand_made_kernels_per_op_and_the_measured_clock']),
    ("kineto import: busy time sums overlapping intervals", "memlens/io/kineto/kernels.py",
     "    run_end = np.maximum.accumulate(e)", "    run_end = e",
     ['tests/integration/test_import_kineto_facts.py::test_union_of_intervals']),
    ("kineto import: a parent need not contain its child", "memlens/io/kineto/attrib.py",
     " & (ends[cand] >= ends - 2)", "",
     ["tests/integration/test_import_kineto_facts.py::test_nesting_of_ops"]),
    ("kineto import: facts also on ops inside the recorder's op", "memlens/io/kineto/facts.py",
     "    carries = own & ~covered", "    carries = own",
     ['tests/integration/test_import_kineto_facts.py::test_facts_are_counted_once_down_a_chain_of_ops']),
    ("kineto import: composites carry the facts", "memlens/io/kineto/facts.py",
     "    own_kernel = not torch._C._dispatch_has_kernel_for_dispatch_key(", "    own_kernel = 1 or not torch._C._dispatch_has_kernel_for_dispatch_key(",
     ['tests/integration/test_import_kineto_facts.py::test_hand_made_cost_facts_by_hand']),
    ("kineto import: unlogged scalars not defaulted", "memlens/io/kineto/facts.py",
     "        if arg.has_default_value():\n            return arg.default_value", "        if arg.has_default_value():\n            return None",
     ['tests/integration/test_import_kineto_facts.py::test_hand_made_cost_facts_by_hand']),
    ("kineto import: keyword-only arguments passed by position", "memlens/io/kineto/facts.py",
     "        if a.kwarg_only:", "        if False:",
     ['tests/integration/test_import_kineto_facts.py::test_hand_made_cost_facts_by_hand']),
    ("kernel clock: a nested op without kernels placed after its parent", "memlens/clock.py",
     "            s = e = pos_s if nested[i] else max(pos_s, pos_e)", "            s = e = max(pos_s, pos_e)",
     ['tests/integration/test_import_kineto_facts.py::test_hand_made_kernels_per_op_and_the_measured_clock']),
    ("device time: the busy time sums every op's inclusive time, not the top-level ones'", "memlens/clock.py",
     "    return {\"device_self_ns\": own, \"device_ns\": inclusive}, int(inclusive[parent < 0].sum())",
     "    return {\"device_self_ns\": own, \"device_ns\": inclusive}, int(inclusive.sum())",
     ['tests/integration/test_import_kineto_facts.py::test_hand_made_kernels_per_op_and_the_measured_clock']),
    ("clock contract: a string clock's units dropped", "memlens/trace/schema.py",
     "    return make_clock(\"host\", source_units=value if isinstance(value, str) else None)",
     "    return make_clock(\"host\")",
     ['tests/integration/test_import_kineto_facts.py::test_every_trace_carries_the_same_clock_dict']),
    ("CPU-run caveat on a modeled clock", "memlens/analysis/findings.py",
     " and clock_of(trace)[\"kind\"] == \"host\":", ":",
     ['tests/integration/test_import_kineto_facts.py::test_a_cpu_recording_has_the_clock_and_retiming_drops_the_cpu_caveat']),
    ("2021 activity categories not matched", "memlens/gpu_activity.py",
     "        cat = str(e.get(\"cat\") or \"\").lower()", "        cat = str(e.get(\"cat\") or \"\")",
     ["tests/integration/test_import_kineto_facts.py::test_kineto_frames_reads_every_era"]),
    ("access events: an op's rows kept apart when their stamps differ", "memlens/analysis/access_events.py",
     '    new[1:] = (row[1:] != row[:-1]) | (op[1:] != op[:-1])',
     '    new[1:] = (row[1:] != row[:-1]) | (op[1:] != op[:-1]) | (stamp[1:] != stamp[:-1])',
     ["tests/unit/test_notice_intervals.py", "tests/unit/test_intervals_reference.py"]),
    ('access events: merged end from the first row only', "memlens/analysis/access_events.py",
     'np.maximum.reduceat(end, heads),',
     'end[heads],',
     ["tests/unit/test_notice_intervals.py", "tests/unit/test_intervals_reference.py"]),
    ('access events: merged start from the first row only', "memlens/analysis/access_events.py",
     'np.minimum.reduceat(start, heads), np.maximum',
     'start[heads], np.maximum',
     ["tests/unit/test_notice_intervals.py", "tests/unit/test_intervals_reference.py"]),
    ('access events: start not widened to an early stamp', "memlens/analysis/access_events.py",
     '    start = np.where(has_op, np.minimum(raw_start, stamp), stamp)',
     '    start = np.where(has_op, raw_start, stamp)',
     ["tests/unit/test_notice_intervals.py", "tests/unit/test_intervals_reference.py"]),
    ('access events: end not widened to a late stamp', "memlens/analysis/access_events.py",
     '    end = np.where(has_op, np.maximum(raw_end, stamp), stamp)',
     '    end = np.where(has_op, raw_end, stamp)',
     ["tests/unit/test_notice_intervals.py", "tests/unit/test_intervals_reference.py"]),
    ('access events: no re-sort after widening', "memlens/analysis/access_events.py",
     "        if back.any():",
     '        if False:',
     ["tests/unit/test_notice_intervals.py", "tests/unit/test_intervals_reference.py"]),
    ('access events: ties in start not ordered by end', "memlens/analysis/access_events.py",
     '((ev_start[1:] == ev_start[:-1]) & (ev_end[1:] < ev_end[:-1]))',
     'False',
     ["tests/unit/test_notice_intervals.py", "tests/unit/test_intervals_reference.py"]),
    ('access events: fast path trusts equal op starts of different ops', "memlens/analysis/access_events.py",
     '((step == 0) & (op[1:] >= op[:-1]))',
     '(step == 0)',
     ["tests/unit/test_notice_intervals.py", "tests/unit/test_intervals_reference.py"]),
    ('access events: lifetime widened by op edges, not stamps', "memlens/analysis/access_events.py",
     'np.minimum.reduceat(stamp, heads), np.maximum.reduceat(stamp, heads))',
     'np.minimum.reduceat(start, heads), np.maximum.reduceat(end, heads))',
     ["tests/unit/test_notice_intervals.py", "tests/unit/test_intervals_reference.py"]),
]


def _edits(old, new) -> list[tuple[str, str, int]]:
    """(original, mutated, expected count) for each edit of a mutant."""
    olds = old if isinstance(old, tuple) and not isinstance(old[1], int) else (old,)
    news = new if isinstance(new, tuple) else (new,) * len(olds)
    out = []
    for o, n in zip(olds, news):
        text, count = o if isinstance(o, tuple) else (o, 1)
        out.append((text, n, count))
    return out


def run(tests: list[str], timeout: float) -> int:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return 124  # a hang counts as killed: the suite noticed


def main(argv: list[str]) -> int:
    survived = []
    chosen = [m for m in MUTANTS if not argv or any(a in m[0] for a in argv)]
    for name, rel, old, new, tests in chosen:
        path = ROOT / rel
        original = path.read_text()
        edits = _edits(old, new)
        stale = [text for text, _, count in edits if original.count(text) != count]
        if stale:
            print(f"STALE    {name}: {stale[0]!r} is not in {rel} the expected number of times; "
                  "update scripts/mutants.py")
            survived.append(name)
            continue
        mutated = original
        for text, replacement, _ in edits:
            mutated = mutated.replace(text, replacement)
        # the tests must pass unmutated, or a "kill" would mean nothing
        if run(tests, 600) != 0:
            print(f"BROKEN   {name}: {' '.join(tests)} fail without the mutant")
            survived.append(name)
            continue
        t = time.perf_counter()
        try:
            path.write_text(mutated)
            code = run(tests, 600)
        finally:
            path.write_text(original)
        status = "killed" if code != 0 else "SURVIVED"
        print(f"{status:8} {name} ({rel}; {time.perf_counter() - t:.0f} s)")
        if code == 0:
            survived.append(name)
    killed = len(chosen) - len(survived)
    print(f"mutation score: {killed}/{len(chosen)} killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
