#!/usr/bin/env bash
# One device session on the lent GPU (docs/PERF.md): set up, then run the named stages, logging
# each to $OUT/<stage>.log (JSON results beside). Stages:
#   env         the GPU, torch/Triton versions, pto info
#   tests       tests/gpu/test_gpu.py (the compiled kernels, both executors)
#   gpu1, gpu2  all of tests/gpu and tests/target in two halves (one call's 590 s holds neither
#               whole suite): decode, megakernel, schedules; then test_gpu, safety, tp, quant, target
#   decode      bench/decode.py: SmolLM2 and the 8B model at batches 1, 8, 32, per-kernel profile
#   fused       pto bench llama7b, fused layer, both executors, eager and torch.compile ($SEQS)
#   modes       pto bench llama7b --attention split and pair, both executors, eager ($MODE_SEQS)
#   fusion      issue 24: the fused layer (eager, torch.compile), --attention pair and split fused by the pass
#               (both executors) at $FUSE_SEQS, and as written (--no-fuse, persistent) at $NOFUSE_SEQS
#   odd         pto bench llama7b, fused, odd lengths ($ODD_SEQS)
#   profile     pto run --profile of the fused layer at 16K, both executors
#   pdl         programmatic dependent launch in the policies $PDL_MODES (default: off late chain
#               auto; PTO_PDL): bench/decode.py for $PDL_CONFIGS at batches $DEC_BATCHES (default 1,8)
#               with the tilings $TILINGS, and the fused layer at $PDL_SEQS (none: skipped)
#   rows        issue 23's lengths with whole row tiles (eager, torch.compile), the same with
#               adaptive (residual) tiles, and the next multiples of 128 ($ROW_SEQS, $ROW_NEXT), on each
#               executor of $ROW_EXECUTORS (default waves; torch.compile beside the first)
#   fnr         --fuse-norm-rope against the unfused layer at $FNR_SEQ, both profiled per function
#   fold        --fuse-norm-rope (the norms' gains folded into the weights) against the unfused layer:
#               the 7B layer at $FOLD_SEQS (unfused with eager and torch.compile), the Llama-3-8B layer
#               at $FOLD8B_SEQS
#   split       the split modes (PTO_SPLIT masks, align): the fused layer at $SPLIT_SEQS (align
#               with eager and torch.compile), the Llama-3-8B layer, the decode step at batch 1
#   tma         tensor-descriptor loads (PTO_TMA off, on): the fused layer at $TMA_SEQS (on: with eager
#               and torch.compile), the Llama-3-8B layer at 4096, the decode step at batches 1 and 8,
#               then the GPU layer tests with PTO_TMA=on
#   layers      the defaults against eager and torch.compile: the 7B layer at $LAYER_SEQS, the next
#               multiples of 128 of its odd lengths ($LAYER_NEXT), the Llama-3-8B layer at $LAYER8B_SEQS
#   tp          issues 25, 47, on $TP_N GPUs (default 2): bench/tp.py at $TP_SEQS (default 4096,16384) for each
#               setting in $TP_RUNS (";"-separated environment and flags; default "--collectives auto,group",
#               e.g. "--chunks 4,8;PTO_COLLECTIVES=evaluator --seq 4096"), each under $TP_LIMIT s (default 240)
#   tpdecode    issues 25, 47, on a machine of $TP_N GPUs (default 2): the 8B decode step at batches $TP_BATCHES
#               (default 1,8) under the collectives modes $TP_COLLECTIVES (default auto,group) and LM heads
#               $TP_HEADS (default parallel), PyTorch's hand-written TP step, one GPU (torchrun bench/decode.py)
#   allreduce   issue 47: the sums by algorithm and size on $TP_N GPUs (torchrun bench/allreduce.py)
#   long        the Llama-3.1-8B step at caches 1024 and 32768 (two combine levels, wider chunks), per-kernel
#   dispatch    the persistent megakernel's cost per work item: 1,024 independent softmax tasks (no
#               waits: the dispatch alone, item_gap_us) and SmolLM2's decode step on both executors
#               (the step's item gap and dependency_wait_us: a predecessor's end to its successor's start;
#               PTO_DISPATCH=queue|static picks the dispatch)
#   persist     persistent tile loops (RenderOptions.persistent): bench/gemm_probe.py with pto's GEMM in
#               each mode, bench/flash_probe.py (base source), and the fused layer at $PERSIST_SEQS
#               (default 1024,4096,16384) under PTO_PERSISTENT in $PERSIST_MODES (default "off loop ws";
#               the last with eager and torch.compile)
#   sched       issue 49: the schedule sets $SCHED_SETS (PTO_SCHEDULES values; default "none
#               nvidia_h100_80gb_hbm3": the heuristics, the H100's shipped ones): the 7B layer at $SCHED_SEQS
#               (default 1537,4096,16384; the first set with eager and torch.compile), the Llama-3-8B layer at
#               $SCHED8B_SEQS (4096; empty: skipped), 3 rounds each
#   tiles       issue 45: the megakernel's batch-8 tiles, each against the default in one run, for
#               $TILES_CONFIGS (default llama3-8b,llama3.2-1b): $TILES_B8 (default "default;+dot_bk=256;+dot_bk=512":
#               the dots' K steps twice and four times as wide; with dot_round each projection's step keeps
#               dot_bn x dot_bk weights, 8 KiB in the default, and a batch-8 item streams about 10 GB/s,
#               what 2-3 such steps in flight give at the memory's latency)
#   executors   issues 45, 49 (--executor auto on the H200): the decode step on both executors in their own tiles,
#               batches 1 and 8, for $EXEC_CONFIGS (default the 8B, the 1B, SmolLM2); the 7B layer on both at
#               $EXEC_SEQS (default 1537,4096), 3 rounds
#   fewrows     issue 45: steps of a few sequences with dense weights, their rows unpadded (dense_rows) or
#               padded to 16, for $FEW_CONFIGS (default the 1B, the 8B) at batches $FEW_BATCHES (default 3,4,8),
#               both executors, under $FEW_TILINGS (default: the defaults, 8 rows unpadded, and 8 rows in K steps
#               of 512: a multiply-sum of R rows holds R times the one row's product a K step)
#   runpf       issue 45: the L2 prefetch now that runs take it (a run's first indices' weights before its wait):
#               bench/megakernel.py --variants ';f=1;f=1,k=128;f=1,k=256;f=light' (k: PTO_MK_PREFETCH_KB, the
#               budget an item, 64 by default: 128 widens the q/k/v runs' prefetch, 256 also gate/up's, to three
#               indices) for $RUNPF_CONFIGS (default the 1B and the 8B: SmolLM2 takes no runs);
#               then the 1B's and 8B's runs in shorter K steps (gate/up 1024 where MEGAKERNEL_WIDE pins 2048, q/k/v
#               512: more trips for the run's pipeline, a smaller first load before it), with and without f=1
#   deps        issue 45: dependencies at the granularity of data (PTO_MK_DEPS=data: a RoPE item of one head waits
#               for that head's projection items, an attention part for its head's): the GPU test
#               (tests/gpu/test_decode_gpu.py -k data_dependencies), then bench/megakernel.py --variants ';w=data'
#               for $DEPS_CONFIGS (default SmolLM2, the 1B, the 8B), then batch 8 on the persistent executor
#               with and without it (bench/decode.py)
#   quantmk     issues 45, 46: the quantized decode steps on both executors (--executor auto keeps the waves for
#               quantized weights until this says otherwise): the 8B in $QUANTMK_TYPES (default Q4_K with a Q6_K
#               head, Q8_0, fp8), batch 1, both in the launches' tiles (--executors waves,persistent: the order
#               that names both; bench/decode.py's --quant takes the wave executor's tiles)
#   q5          issue 46: the 5-bit formats as stored: their GPU tests, then bench/decode.py on SmolLM2 at batch 1
#               with $Q5_SPECS (default bf16, the file's Q4_1 with its Q8_0 head, Q5_0, Q5_1), both executors,
#               and on the 8B with $Q5_SPECS_8B (default Q5_K, Q4_K with a Q6_K head), the launches
#   q5blocks    issue 46: the 5-bit formats' gate/up GEMV in "blocks" form (PTO_BLOCKS_FORMATS=+q5_0,q5_1,q5_k;
#               from their SASS the 8B's Q5_K gate/up 6.41 -> 4.51 instructions a weight): the GPU tests -k q5 with
#               it, then bench/decode.py on the 8B (Q5_K) and SmolLM2 (Q5_0, Q5_1) at batch 1 without and with it
#   splitdown   issues 45, 46: the down projection by parts (DecodeTiling.split_down, its programs adding
#               into the f32 residual): the GPU test, then bench/decode.py on $SPLIT_CONFIGS (default the 8B)
#               with $SPLIT_QUANT (default Q4_K with a Q6_K head, Q8_0, fp8) under $SPLIT_TILINGS (default
#               the default and parts of 2048, 4096), then bench/megakernel.py for $SPLIT_MK_CONFIGS
#               (default SmolLM2, the 1B, the 8B; "none" skips it) under $SPLIT_MK_TILINGS, both executors
#   qprefill    issue 46: the prefill with quantized weights (each layer's matrices dequantized first, a
#               program a tile, in spans of layers): the GPU tests (the prefill's caches against the CPU's too),
#               bench/prefill_profile.py (SmolLM2 in bf16 and Q4_1: host against device time), then
#               bench/decode.py's 512-token prefill of SmolLM2 (bf16, the
#               file's Q4_1 with a Q8_0 head, Q5_0) and of the 8B (bf16, Q4_K with a Q6_K head, Q8_0), both ways
#   combo       issue 45: one sequence's attention combine folded into the o projection
#               (DecodeTiling.fold_combine): the GPU test, then bench/megakernel.py for $COMBO_CONFIGS
#               (default SmolLM2 and the 1B) at batch 1 under $COMBO_TILINGS (default the default and
#               fold_combine 8, 16, 32), both executors
#   ffnfold     issue 45: the FFN in one level (DecodeTiling.fold_down: gate, up and the down projection
#               in one task, its programs adding into the f32 residual): the GPU test, then bench/ffn_fold.py
#               (the task alone against its two) and bench/megakernel.py for $FOLD_CONFIGS (default SmolLM2)
#               at batches $FOLD_BATCHES (default 1,2) under $FOLD_TILINGS (default "default;+fold_down=8;
#               +fold_down=4"), both executors
#   smolattn    issue 45: SmolLM2's attention in fewer, longer parts ($SMOLATTN_TILINGS, default the default
#               and chunks of 256, 512 and 1024 cache slots: a head's cache in one part at 1024, its combine
#               then over one state), bench/megakernel.py with the item path (its waits are 45% of the step)
#   quantsplit  issue 46 on the megakernel: the 8B's quantized steps ($QUANTSPLIT_TYPES, default Q4_K with a
#               Q6_K head and fp8) on the persistent executor in its own tiles (+V1 of docs/PERF.md's ninth
#               session) with the GEMVs in launches of their own by resource class (PTO_MK_SPLIT=auto) and
#               without (off); the waves: 2.72 and 2.65 ms in the ninth session
#   persm       issue 45: the 1B's GEMV items run below the memory's floor (gate/up 21.4 us a layer against 16.1):
#               three programs a multiprocessor and a run per program (PTO_PER_SM=3, PTO_MK_RUNS=396), with and
#               without the prefetch, for $PERSM_CONFIGS (default the 1B)
#   intdots     issue 46: the integer dots where they are not yet measured: tests/gpu/test_quant_gpu.py (every
#               format's dots at 8 and 16 bits, the quantized steps), the 8B step with a Q6_K head and all in
#               Q6_K by groups' float dots (auto) and int16, Q8_0's o projection in other tiles ($INTDOT_O_TILINGS)
#   halfdots    issue 46: fp8's half dots (x as f16, f16x2 multiply-adds of the e4m3 bytes) and Q6_K's
#               integer dots, auto's since 2026-11-30: their GPU tests, fp8's kernels and the 8B step by
#               units against auto, SmolLM2 in Q4_1 against bf16, Q8_0's o projection in 16 x 2,048 tiles
#   chain       issue 45: bench/gluon_chain.py: a chain of dependent GEMV layers in one persistent launch,
#               the megakernel's wait-then-load in Triton against a Gluon loader whose ring of cp.async
#               buffers streams the next layer's weights while the program waits ($CHAIN_ARGS; default
#               one and two programs a multiprocessor at D 2,048 and 4,096)
#   llchain     issue 45: bench/gluon_chain.py --ways pre,ll,lpdl,lll: a layer's wait by the megakernel's counter
#               against x passed as flagged 8-byte words (NCCL's LL), in one persistent launch, then a launch a
#               layer under PDL (griddepcontrol.wait, the wave executor's, against the words and no wait); the
#               weights loaded before the wait in all; at $LL_D (default 576,576,1024) with $LL_ROWS rows a
#               program, $LL_WARPS warps, with and without the waits
#   order       a process's fourth CUDA graph slows every many-kernel replay (bench/step_order.py): the driver's
#               version, six steps in turn, then three throwaway graphs made four ways (torch.cuda.graph's;
#               capture_begin/end alone; the same after empty_cache, of 300 kernels and of one)
#   fair        issue 45: the executors, a process a configuration and batch ($FAIR_CONFIGS, $FAIR_BATCHES), so
#               no process passes its third graph; SETTLED=1: each after three throwaway graphs (--settle)
#   inline      issue 45: the megakernel's inline items (PTO_MK_INLINE=on): the GPU test, then SmolLM2, the 1B
#               and the 8B with and without, alternated ($INLINE_CONFIGS, $INLINE_BUDGET)
#   q41         issue 46: the 8B's Q4_1 prefill both ways, then SmolLM2's Q4_1 step against bf16 by kernel
#   q41warps    issue 46: SmolLM2's Q4_1 step by kernel at PTO_QGEMV_WARPS $Q41_WARPS (default 1 2 4)
#   q41by       issue 46: SmolLM2's Q4_1 residual GEMVs at four warps, the rest by the rule
#               (PTO_QGEMV_WARPS=1,gemv_residual_tile_o=4,gemv_residual_tile=4), against the default, twice
#   q41tile     issue 46: SmolLM2's Q4_1 residual GEMVs' tiles ($Q41_TILINGS; from their SASS, o at 8 rows and
#               512 columns a K step has 4.41 instructions a weight and 8 barriers at four warps, the default
#               11.06 and 18), bf16 beside, settled; twice
#   gluonq4     issue 46: a 4-bit GEMV's streaming with a shared-memory ring (bench/gluon_q4.py: Q4_1's
#               arithmetic on x rounded once, a Triton K loop against a Gluon cp.async ring), then pto's own Q4_1
#               and Q4_K GEMVs of the same shapes alone (bench/qgemv.py) for the comparison
#   tuneship    issue 49: one layer tuned and checked in one call: the layer as shipped ($TS_PROGRAM, PROGRAM[/CONFIG],
#               default llama/llama3-8b, at $TS_SEQ, default 4096), then `pto tune` there ($TS_BUDGET s), the winners
#               merged into this copy's shipped folder (bench/ship_schedules.py), the layer again; each layer run
#               against torch.compile in its process; the database archived to $OUT for shipping here
#   lmbk        issue 46: the 8B's quantized LM heads at K steps of 1,024 (bench/qgemv_sass.py: Q6_K's head 128
#               registers and 4 programs a multiprocessor where the default 2,048 takes 254 and 2; Q8_0 147 and 3
#               against 229 and 2; fp8 117 and 4 against 160 and 3), the steps in Q4_K (Q6_K head), Q8_0 and fp8,
#               --timeline, twice (run 2026-12-02: Q6_K's head gained and takes 1,024 by default since, so its
#               "default" and "lm_bk=1024" are now the same; Q8_0's and fp8's lost)
#   q6head      issue 46: Q6_K heads at K steps of 1,024 by default (quantized.HEAD_STEPS) checked and measured:
#               the Q6_K step of $Q6H_CONFIG (default llama3-8b) against its f32 reference on both executors
#               (pto run --check), then the 1B (its tied head Q6_K) and the 8B in Q4_K with a Q6_K head in
#               the tilings $Q6H_TILINGS (default 'default;lm_bk=2048': against the old steps of 2,048),
#               --timeline (tests/gpu/test_quant_gpu.py, once between them, ran past a call's 600 s on a
#               fresh machine compiling every kernel: run it alone)
#   downblocks  issue 46: the 8B's down projection alone (bench/qgemv.py) as the plain grid and as a "blocks" loop
#               (PTO_PERSISTENT=blocks: the next block's weights loaded ahead) in blocks of 1, 2 and 4 rows of
#               the whole K (one step of 16,384: by their SASS 104-128 registers, 8 warps, 2 programs a
#               multiprocessor, 2.7-5.1 instructions a weight), Q4_K, Q4_1, Q8_0 and fp8: a plain read of its
#               bytes reaches 0.89 of a copy, pto's Q4_K 0.53 (docs/PERF.md, "Twenty-seventh session"); then the o
#               projection the same ways in blocks of 8 (its default), 2 and 4 rows of its whole K (Q4_K, Q4_1)
#   downstep    issue 46: the same in the 8B's whole step (bench/decode.py --timeline --settle): the down
#               projection's tiles as they are and in blocks of 1 and 2 whole-K rows, as the plain grid and as a loop
#               over its blocks (PTO_BLOCKS_FUNCTIONS=gemv_residual_tile), Q4_K (Q6_K head) and Q8_0
#   quant8      issue 46: where batch 8's quantized step goes (Q4_K 15.9 ms against 2.3 at batch 1): the 8B
#               step at 1 and 8 sequences in Q4_K (Q6_K head) and fp8, each kernel profiled (--kernels)
#   qwarps      issue 46: the grouped GEMVs' fewest warps a program (PTO_QGEMV_WARPS=1, the rule's, then 2
#               and 4): SmolLM2 in its file's types against bf16 (its GEMVs get one warp by the rule), the
#               8B step in Q4_K, Q8_0 and fp8 (its down projection gets two)
#   qcols       issue 46: the grouped GEMVs' columns a warp (PTO_QGEMV_COLS=1024, the rule's thread a group,
#               then 2048, two groups a thread: a fifth fewer instructions a weight in Q4_K's SASS), twice
#               each: the 8B and 1B steps in Q4_K, Q8_0 and fp8; then the 8B's kernels without PDL
#               (--kernels) at $QCOLS_PROFILE (default 2048) in bf16 and Q4_K, and the quantized GPU tests at it
#   blocks      issues 45, 46: the persistent "blocks" loops (PTO_PERSISTENT=blocks: each GEMV program over its
#               task's blocks, x and the norm once a program) against the plain grid, alternated ($BLOCKS,
#               default "off blocks off blocks"; "auto", the default, loops the 4-bit gate/up GEMVs only):
#               the 8B and 1B steps in bf16, Q4_K, Q8_0 and fp8
#   forms       issue 46: the 8B's gate/up GEMV alone in bench/qgemv_forms.py's forms ($FORMS_SPECS, default
#               Q4_K, Q8_0 and fp8), twice
#   records     issue 45: the default megakernel steps of $RECORDS_CONFIGS (default SmolLM2, the 1B, the 8B) traced
#               under $RECORDS_VARIANTS (default d=static) at $RECORDS_BATCHES sequences (default 1; e.g. 1,8 for
#               batch 8's per-layer profile; --records: every item's start, end and multiprocessor, to
#               $OUT/records/, for bench/records.py off the GPU)
#   tune        issue 49: pto tune on this GPU for $TUNE_PROGRAMS (default "llama7b:16384,4096,1537"; entries
#               PROGRAM[/CONFIG]:SEQS, space-separated, e.g. "llama/mistral-7b:5555"; --config 7b for llama7b,
#               llama3-8b for llama where none is named) within $TUNE_BUDGET s each (default 480; the first
#               run of each length's layer, which compiles it, counts), into a fresh database archived to
#               $OUT/schedules_<device>.tar.gz: the winners over what the device ran (its shipped entries),
#               to merge into orchestration/llama/schedules/<device>/ with bench/ship_schedules.py
#   mkstages    issue 45: the megakernel's pipelines deepened (PTO_MK_STAGES: every loading loop at N stages, lowered
#               where shared memory runs out; "schedule": the schedules' alone; "default": unset, the schedules' with
#               5 in the lone dot projections) for N in $MKS_STAGES (default "schedule default 4 5 6"), a process
#               each: bench/decode.py's persistent step for $MKS_CONFIGS (default the 8B, the 1B) at batches
#               $MKS_BATCHES (default 8,1) in the tilings $MKS_TILINGS (default "default"). At batch 8 the
#               projections' dot loops stream about 10-17 GB/s a program with 3 stages (docs/PERF.md)
#   affinity    issue 45: the list schedule's affinity (PTO_MK_AFFINITY off, on: an item of narrower data
#               dependencies, a RoPE item of one head, starts on the program of its last producer), a process
#               each: bench/decode.py's persistent step for $AFF_CONFIGS (default the 8B) at batches $AFF_BATCHES
#               (default 1), with the item path (the RoPE items' dispatch on the 8B's: 43-46 us a step)
#   pdllate     issues 45, 46: the 8B's steps (bf16 and quantized, $LATE_TYPES) and SmolLM2's (bf16, its file's
#               types) on the waves, timed by kernel, as they are and with the o projection loading nothing
#               before its PDL wait (PTO_PDL_LATE)
#   qscales     issue 46: the quantized steps at $QS_BATCHES (default 8,1) for $QS_TYPES on the waves, and the
#               SmolLM2 Q4_1 prefill as stored, with the tiles' scales a value a unit (PTO_QSCALES=units) and a
#               value a group (groups, the default since 2026-12-04), a process each, twice in turn
#   runloop     issues 45, 46: the megakernel's runs by form (PTO_MK_RUNLOOP: $RL_FORMS, default "blocks steps";
#               flat, blocks and steps all near a call's 10 minutes: RL_CONFIGS/RL_QUANT for fewer), first the
#               quantized persistent GPU tests (tests/gpu/test_quant_gpu.py -k persistent, the default forms),
#               then a process a form, twice in turn: the persistent executor at one sequence for $RL_QUANT
#               (default the 8B's Q4_K with a Q6_K head, Q8_0, fp8, the 1B's Q4_K, SmolLM2's Q4_1) and, with
#               RL_BF16=1, bf16 for $RL_CONFIGS (default the 8B, the 1B, SmolLM2); the waves once beside them
#               with RL_WAVES=1; $RL_ENV (default none) is more environment for every form, e.g.
#               "PTO_MK_SPLIT=-2 PTO_PER_SM=4,0 PTO_MK_RUNS=528"
#   mkwarps     issue 45: the quantized persistent steps at one sequence (RL_QUANT's) under each environment of
#               $MKW_ENVS (";"-separated; default the megakernel's warps and programs a multiprocessor measured on
#               2026-12-04: "PTO_MK_WARPS=8 PTO_PER_SM=2;PTO_MK_WARPS=8;PTO_MK_WARPS=2 PTO_PER_SM=4"), then the
#               defaults, each with its megakernels' registers, spills, programs a multiprocessor and warps
#   mkregs      issue 45: the megakernel's register-saving forms ($MKR_ENV, default the branches not inlined
#               where the inlined kernel spills and constant strides, the winners of 2026-12-05, PERF.md
#               thirty-ninth): the GPU's persistent tests under them, then the
#               steps of $RL_QUANT (default bf16 and the quantized ones of mkwarps) under $MKW_ENVS (default
#               $MKR_ENV), then the defaults with the waves beside them
#   kahead      issue 46: the wave kernels' quantized K loops with their next step loaded ahead (PTO_K_AHEAD in
#               $KA_MODES, default "off on"): the GPU's quantized wave tests in each mode of $KA_TESTS (default
#               "on first"; empty: none), then the
#               one-sequence steps of $KA_QUANT (default the 8B's Q4_K with a Q6_K head, Q8_0, fp8, the 1B's Q4_K,
#               SmolLM2's Q4_1), a process a mode, twice in turn, with each kernel's advance (--timeline)
#   variants    one-sequence steps of $V_CONFIGS (default llama3-8b) in $V_QUANT (default fp8) under each of
#               $VARIANTS ("NAME|ENV...|TILING" entries separated by ';', the ENV words as env takes them; the
#               first is the base), a process each, twice in turn, with --timeline
#   cold        the first run of a new shape: empty pto and Triton caches, an empty Triton cache
#               compiling on 1 and 16 threads (PTO_COMPILE_THREADS), warm caches (wall seconds)
#   ab          an unmerged change measured against this tree in one call: $AB_CMD run with this
#               tree's pto, then with the tree in _ab/ (ignored by git: `bench/ab_tree.sh REF` puts a
#               commit's files there; carry "_ab" with the call), each with AB_TAG=base or ab in its
#               environment for the names of its outputs (e.g. --json "$OUT/q_$AB_TAG.json")
# e.g.  SEQS=1024,4096 bench/gpu_session.sh env tests fused
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING
[ -d /tmp/site/cffi ] || exit 1
export PYTHONPATH=/tmp/site:$PWD PTO_CACHE_DIR=${PTO_CACHE_DIR:-/tmp/ptocache} PYTHONUNBUFFERED=1
BENCH="python3 -m pto.cli bench llama7b --config 7b --dtype bf16 --iterations ${ITER:-20}"
# the register study's forms of the megakernel together (mkregs)
MKR_ENV=${MKR_ENV:-PTO_MK_CALLS=auto PTO_MK_STRIDES=constant}
# mk_envs ENVS QUANT TAG: the persistent steps at one sequence ($MK_BATCHES: those batches) of the three models
# ($MK_CONFIGS: those) in QUANT (bench/decode.py's
# --quant) under each ";"-separated environment of ENVS, then the defaults with the waves beside them, each with
# its megakernels' registers, spills, programs a multiprocessor and warps
mk_envs() {
  local envs e k=0 ex
  IFS=';' read -ra envs <<< "$1"
  envs+=("")  # (the defaults last, in the same call)
  for e in "${envs[@]}"; do
    k=$((k + 1)); ex=persistent; [ -z "$e" ] && ex=waves,persistent
    env $e python3 bench/decode.py --configs ${MK_CONFIGS:-llama3-8b,llama3.2-1b,smollm2-135m} \
      --batches ${MK_BATCHES:-1} --long 0 \
      --steps 32 --executors $ex --hf-configs none --prefill 0 --quant "$2" \
      --json "$OUT/$3_$k.json" > "$OUT/$3_$k.log" 2>&1
    echo "[${e:-defaults}] rc=$?"; grep -h " B=" "$OUT/$3_$k.log" | cut -c1-80
    python3 - "$OUT/$3_$k.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    rep = r.get("persistent", {}).get("report", {})
    segs = rep.get("segments", [rep])
    print(" ", r["config"], r["quant"], "regs/spills/programs/warps",
          [(s.get("regs"), s.get("spills"), s.get("programs_per_sm"), s.get("warps")) for s in segs],
          "gap", rep.get("item_gap_us"), "wait", rep.get("dependency_wait_us"))
PY
  done
}
# ab VAR "A B" SEQS SEQS_8B: VAR=A, then VAR=B (the last with eager and torch.compile beside it):
# the fused 7B layer at SEQS, the Llama-3-8B layer at SEQS_8B, the decode step at batches 1 and 8
ab() {
  local var=$1 vals=$2 seqs=$3 seqs8b=$4 last=${2##* } v cmp
  for v in $vals; do
    cmp=none; [ "$v" = "$last" ] && cmp=eager,compile
    env "$var=$v" $BENCH --seq "$seqs" --executor waves --compare $cmp --json "$OUT/${var}_$v.json" \
      > "$OUT/${var}_$v.log" 2>&1; echo "$var=$v"; tail -6 "$OUT/${var}_$v.log"
    env "$var=$v" python3 -m pto.cli bench llama --config llama3-8b --dtype bf16 --iterations ${ITER:-20} \
      --seq "$seqs8b" --executor waves --compare $cmp > "$OUT/${var}_8b_$v.log" 2>&1; tail -4 "$OUT/${var}_8b_$v.log"
    env "$var=$v" python3 bench/decode.py --configs smollm2-135m,llama3-8b --batches 1,8 --long 0 --steps 16 \
      --executors waves --hf-configs none > "$OUT/${var}_decode_$v.log" 2>&1; grep "B=" "$OUT/${var}_decode_$v.log"
  done
}
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    ab) [ -d _ab/pto ] || { echo "ab: no _ab/ tree (bench/ab_tree.sh REF, then carry _ab)"; continue; }
        [ -n "${AB_CMD:-}" ] || { echo "ab: set AB_CMD, the command to measure"; continue; }
        for tag in base ab; do
          root=$PWD cache=$PTO_CACHE_DIR  # (the base's warm cache; the other tree's kernels apart)
          [ $tag = ab ] && root=$PWD/_ab cache=${PTO_CACHE_DIR}_ab
          (cd "$root" && AB_TAG=$tag PYTHONPATH=/tmp/site:$root PTO_CACHE_DIR=$cache \
             bash -c "$AB_CMD" > "$OUT/ab_$tag.log" 2>&1); echo "--- $tag"; tail -${AB_TAIL:-8} "$OUT/ab_$tag.log"
        done ;;
    env) { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
           python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
           python3 -m pto.cli info; } 2>&1 | tee "$OUT/env.log" ;;
    tests) python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_gpu.py tests/target/test_target.py 2>&1 \
           | tee "$OUT/tests.log" | tail -20 ;;
    gpu1) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode_gpu.py tests/gpu/test_megakernel_gpu.py \
            tests/gpu/test_schedules_gpu.py > "$OUT/gpu1.log" 2>&1; tail -15 "$OUT/gpu1.log" ;;
    gpu2) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py tests/gpu/test_safety_gpu.py \
            tests/gpu/test_tp_gpu.py tests/gpu/test_quant_gpu.py tests/target > "$OUT/gpu2.log" 2>&1
          tail -15 "$OUT/gpu2.log" ;;
    decode) python3 bench/decode.py --configs smollm2-135m,llama3-8b --batches 1,8,32 --long 0 --steps 16 \
              --executors waves --hf-configs none --kernels --json "$OUT/decode.json" > "$OUT/decode.log" 2>&1
            grep "B=" "$OUT/decode.log" ;;
    fused) $BENCH --seq "${SEQS:-1024,4096,16384}" --executor waves,persistent --json "$OUT/fused.json" 2>&1 \
           | tee "$OUT/fused.log" | tail -12 ;;
    modes) for a in pair split; do
             $BENCH --seq "${MODE_SEQS:-4096,16384}" --attention $a --executor waves,persistent --compare eager \
               --json "$OUT/modes_$a.json" 2>&1 | tee "$OUT/modes_$a.log" | tail -6
           done ;;
    fusion) F=${FUSE_SEQS:-4096,16384}  # issue 24: the pass's split and pair against the hand-fused layer
            $BENCH --seq "$F" --executor waves --json "$OUT/fusion_fused.json" > "$OUT/fusion_fused.log" 2>&1
            tail -4 "$OUT/fusion_fused.log"
            for a in pair split; do
              $BENCH --seq "$F" --attention $a --executor waves,persistent --compare none \
                --json "$OUT/fusion_$a.json" > "$OUT/fusion_$a.log" 2>&1; tail -4 "$OUT/fusion_$a.log"
              $BENCH --seq "${NOFUSE_SEQS:-4096}" --attention $a --no-fuse --executor persistent --compare none \
                --json "$OUT/fusion_${a}_written.json" > "$OUT/fusion_${a}_written.log" 2>&1
              tail -2 "$OUT/fusion_${a}_written.log"
            done ;;
    odd) $BENCH --seq "${ODD_SEQS:-777,3000,12345}" --executor waves,persistent --compare eager \
           --json "$OUT/odd.json" 2>&1 | tee "$OUT/odd.log" | tail -8 ;;
    profile) for e in waves persistent; do
               python3 -m pto.cli run llama7b --config 7b --seq ${PROFILE_SEQ:-16384} --executor $e --profile \
                 --json 2>&1 | tee "$OUT/profile_$e.json" | tail -3
             done ;;
    pdl) for p in ${PDL_MODES:-off late chain auto}; do
           PTO_PDL=$p python3 bench/decode.py --configs "${PDL_CONFIGS:-smollm2-135m,llama3-8b}" \
             --batches "${DEC_BATCHES:-1,8}" --long 0 --steps 16 --executors waves --hf-configs none \
             --tilings "${TILINGS:-default}" --json "$OUT/decode_pdl_$p.json" > "$OUT/decode_pdl_$p.log" 2>&1
           echo "PTO_PDL=$p"; grep "B=" "$OUT/decode_pdl_$p.log"
         done
         for p in ${PDL_MODES:-off late chain auto}; do
           [ "${PDL_SEQS:-1024,4096}" = none ] && break
           PTO_PDL=$p $BENCH --seq "${PDL_SEQS:-1024,4096}" --executor waves --json "$OUT/fused_pdl_$p.json" \
             > "$OUT/fused_pdl_$p.log" 2>&1
           echo "PTO_PDL=$p"; tail -4 "$OUT/fused_pdl_$p.log"
         done ;;
    rows) R=${ROW_SEQS:-1024,1537,4096,5555,16384,20001}
          exs=${ROW_EXECUTORS:-waves}
          for ex in $exs; do  # (the persistent executor runs a short tail's items in idle programs)
            cmp=none; [ "$ex" = "${exs%% *}" ] && cmp=eager,compile
            echo "[$ex]"
            $BENCH --seq "$R" --row-tiles whole --executor "$ex" --compare $cmp --json "$OUT/rows_whole_$ex.json" \
              > "$OUT/rows_whole_$ex.log" 2>&1; tail -8 "$OUT/rows_whole_$ex.log"
            $BENCH --seq "$R" --row-tiles adaptive --executor "$ex" --compare none --json "$OUT/rows_adaptive_$ex.json" \
              > "$OUT/rows_adaptive_$ex.log" 2>&1; tail -8 "$OUT/rows_adaptive_$ex.log"
            $BENCH --seq "${ROW_NEXT:-1664,5632,20096}" --row-tiles whole --executor "$ex" --compare none \
              --json "$OUT/rows_next_$ex.json" > "$OUT/rows_next_$ex.log" 2>&1; tail -5 "$OUT/rows_next_$ex.log"
          done ;;
    fnr) for f in --no-fuse-norm-rope --fuse-norm-rope; do
           python3 -m pto.cli run llama7b --config 7b --seq ${FNR_SEQ:-4096} $f --executor waves --profile --json \
             > "$OUT/fnr$f.json" 2> "$OUT/fnr$f.err"; tail -c 1500 "$OUT/fnr$f.json"; echo
         done ;;
    fold) for f in --no-fuse-norm-rope --fuse-norm-rope; do
            cmp=none; [ "$f" = --no-fuse-norm-rope ] && cmp=eager,compile
            $BENCH --seq "${FOLD_SEQS:-1024,1537,4096,16384}" $f --executor waves --compare $cmp \
              --json "$OUT/fold$f.json" > "$OUT/fold$f.log" 2>&1; tail -6 "$OUT/fold$f.log"
            python3 -m pto.cli bench llama --config llama3-8b --dtype bf16 --iterations ${ITER:-20} $f \
              --seq "${FOLD8B_SEQS:-4096}" --executor waves --compare $cmp --json "$OUT/fold_8b$f.json" \
              > "$OUT/fold_8b$f.log" 2>&1; tail -3 "$OUT/fold_8b$f.log"
          done ;;
    split) ab PTO_SPLIT "masks align" "${SPLIT_SEQS:-1024,1537,4096,5555,20001}" "${SPLIT8B_SEQS:-1024,1537,4096}" ;;
    tma) ab PTO_TMA "off on" "${TMA_SEQS:-1024,4096,16384}" 4096
         PTO_TMA=on python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py -k "tiny_layer or family or 7b_layer" \
           > "$OUT/tma_tests.log" 2>&1; tail -3 "$OUT/tma_tests.log" ;;
    persist) python3 bench/gemm_probe.py --json "$OUT/persist_gemm.json" \
               --pto-launch '{"persistent": "loop"};{"persistent": "ws"}' \
               > "$OUT/persist_gemm.log" 2>&1; grep -o '^[0-9x]* [^{]*{[^,]*, "tflops": [0-9.]*' "$OUT/persist_gemm.log"
             python3 bench/flash_probe.py 16384 --patches base > "$OUT/persist_flash.log" 2>&1; cat "$OUT/persist_flash.log"
             modes=${PERSIST_MODES:-off loop ws}
             for v in $modes; do
               cmp=none; [ "$v" = "${modes##* }" ] && cmp=eager,compile
               PTO_PERSISTENT=$v $BENCH --seq "${PERSIST_SEQS:-1024,4096,16384}" --executor waves --compare $cmp \
                 --json "$OUT/persist_$v.json" > "$OUT/persist_$v.log" 2>&1; echo "PTO_PERSISTENT=$v"; tail -5 "$OUT/persist_$v.log"
             done ;;
    sched) # issue 49: schedule sets on this GPU (PTO_SCHEDULES: none, the renderer's heuristics; a device's
           # name, its shipped ones and its kin's), the 7B layer and the Llama-3-8B layer, waves
           cmp=eager,compile
           for v in ${SCHED_SETS:-none nvidia_h100_80gb_hbm3}; do
             PTO_SCHEDULES=$v $BENCH --seq "${SCHED_SEQS:-1537,4096,16384}" --executor waves --rounds 3 --compare $cmp \
               --json "$OUT/sched_7b_$v.json" > "$OUT/sched_7b_$v.log" 2>&1; echo "PTO_SCHEDULES=$v"; tail -5 "$OUT/sched_7b_$v.log"
             cmp=none
             [ "${SCHED8B_SEQS-4096}" ] || continue
             PTO_SCHEDULES=$v python3 -m pto.cli bench llama --config llama3-8b --dtype bf16 --iterations ${ITER:-20} \
               --seq "${SCHED8B_SEQS:-4096}" --executor waves --rounds 3 --compare none \
               --json "$OUT/sched_8b_$v.json" > "$OUT/sched_8b_$v.log" 2>&1; tail -3 "$OUT/sched_8b_$v.log"
           done ;;
    layers) $BENCH --seq "${LAYER_SEQS:-1024,1537,4096,5555,16384,20001,32768}" --executor waves \
              --json "$OUT/layers_7b.json" > "$OUT/layers_7b.log" 2>&1; tail -8 "$OUT/layers_7b.log"
            $BENCH --seq "${LAYER_NEXT:-1664,5632,20096}" --executor waves --compare none \
              --json "$OUT/layers_next.json" > "$OUT/layers_next.log" 2>&1; tail -4 "$OUT/layers_next.log"
            python3 -m pto.cli bench llama --config llama3-8b --dtype bf16 --iterations ${ITER:-20} \
              --seq "${LAYER8B_SEQS:-1024,4096,16384}" --executor waves --json "$OUT/layers_8b.json" \
              > "$OUT/layers_8b.log" 2>&1; tail -4 "$OUT/layers_8b.log" ;;
    tiles) python3 bench/decode.py --configs "${TILES_CONFIGS:-llama3-8b,llama3.2-1b}" --batches 8 --long 0 --steps 32 \
             --executors persistent --hf-configs none --tilings "${TILES_B8:-default;+dot_bk=256;+dot_bk=512}" \
             --json "$OUT/tiles_b8.json" > "$OUT/tiles_b8.log" 2>&1; grep "B=" "$OUT/tiles_b8.log" ;;
    fewrows) python3 bench/decode.py --configs "${FEW_CONFIGS:-llama3.2-1b,llama3-8b}" --batches "${FEW_BATCHES:-3,4,8}" \
               --long 0 --steps 16 --executors persistent,waves --hf-configs none \
               --tilings "${FEW_TILINGS:-default;+dense_rows=8;+dense_rows=8,bk=512,qkv_bk=512,o_bk=512,ffn_bk=512}" \
               --json "$OUT/fewrows.json" > "$OUT/fewrows.log" 2>&1; grep "B=" "$OUT/fewrows.log" ;;
    executors) python3 bench/decode.py --configs "${EXEC_CONFIGS:-llama3-8b,llama3.2-1b,smollm2-135m}" --batches 1,8 \
                 --long 0 --steps 32 --executors persistent,waves --hf-configs none --tilings default \
                 --json "$OUT/executors.json" > "$OUT/executors.log" 2>&1; grep "B=" "$OUT/executors.log"
               $BENCH --seq "${EXEC_SEQS:-1537,4096}" --executor waves,persistent --compare none --rounds 3 \
                 --json "$OUT/executors_7b.json" > "$OUT/executors_7b.log" 2>&1; tail -5 "$OUT/executors_7b.log" ;;
    mkstages) for n in ${MKS_STAGES:-schedule default 4 5 6}; do
                if [ "$n" = default ]; then unset PTO_MK_STAGES; else export PTO_MK_STAGES=$n; fi
                python3 bench/decode.py --configs "${MKS_CONFIGS:-llama3-8b,llama3.2-1b}" --batches "${MKS_BATCHES:-8,1}" \
                  --long 0 --steps 24 --executors persistent --hf-configs none --tilings "${MKS_TILINGS:-default}" \
                  --json "$OUT/mkstages_$n.json" \
                  > "$OUT/mkstages_$n.log" 2>&1; echo "stages $n"; grep "B=" "$OUT/mkstages_$n.log"
              done; unset PTO_MK_STAGES ;;
    affinity) for a in off on; do
                PTO_MK_AFFINITY=$a python3 bench/decode.py --configs "${AFF_CONFIGS:-llama3-8b}" \
                  --batches "${AFF_BATCHES:-1}" --long 0 --steps 24 --executors persistent --hf-configs none \
                  --json "$OUT/affinity_$a.json" > "$OUT/affinity_$a.log" 2>&1
                echo "affinity $a"; grep "B=\|item path" "$OUT/affinity_$a.log"
              done ;;
    fair) # issue 45: the executors compared with no process past its third CUDA graph (a process a
          # configuration and batch: its two steps; docs/PERF.md, "Twenty-fourth session"), then
          # SETTLED=1: the same with three throwaway graphs first (every step in the slower state)
          for c in ${FAIR_CONFIGS:-smollm2-135m llama3.2-1b llama3-8b}; do for b in ${FAIR_BATCHES:-1 8}; do
            python3 bench/decode.py --configs "$c" --batches "$b" --long 0 --steps 32 --executors persistent,waves \
              --hf-configs none ${SETTLED:+--settle} > "$OUT/fair_${c}_$b.log" 2>&1; grep "B=" "$OUT/fair_${c}_$b.log"
          done; done ;;
    q5) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_quant_gpu.py -k "q5" 2>&1 | tail -2
        python3 bench/decode.py --configs smollm2-135m --batches 1 --long 0 --hf-configs none \
          --executors waves,persistent --quant "${Q5_SPECS:-bf16,smollm2-135m:q4_1/q8_0,smollm2-135m:q5_0,smollm2-135m:q5_1}" \
          --json "$OUT/q5.json" > "$OUT/q5.log" 2>&1; grep "B=1" "$OUT/q5.log" | cut -c1-200
        python3 bench/decode.py --configs llama3-8b --batches 1 --long 0 --steps 32 --hf-configs none --prefill 0 \
          --executors waves --quant "${Q5_SPECS_8B:-q5_k,q4_k/q6_k}" --json "$OUT/q5_8b.json" > "$OUT/q5_8b.log" 2>&1
        grep "B=1" "$OUT/q5_8b.log" | cut -c1-200 ;;
    splitdown) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode_gpu.py -k by_parts 2>&1 | tail -2
           T="${SPLIT_TILINGS:-default;+split_down=2048;+split_down=4096}"
           python3 bench/decode.py --configs "${SPLIT_CONFIGS:-llama3-8b}" --batches 1 --long 0 --steps 32 \
             --executors waves --hf-configs none --prefill 0 --quant "${SPLIT_QUANT:-q4_k/q6_k,q8_0,fp8}" \
             --tilings "$T" --json "$OUT/split_q.json" > "$OUT/split_q.log" 2>&1; grep "B=1" "$OUT/split_q.log" | cut -c1-160
           [ "${SPLIT_MK_CONFIGS:-}" = none ] && continue
           python3 bench/megakernel.py --configs "${SPLIT_MK_CONFIGS:-smollm2-135m,llama3.2-1b,llama3-8b}" --batches 1 \
             --variants '' --tilings "${SPLIT_MK_TILINGS:-default;+split_down=768;+split_down=2048}" \
             --waves "${SPLIT_MK_TILINGS:-default;+split_down=768;+split_down=2048}" --budget "${SPLIT_BUDGET:-240}" \
             --json "$OUT/split_mk.json" > "$OUT/split_mk.log" 2>&1
           grep -E " ms  floor|skipped" "$OUT/split_mk.log" ;;
    q5blocks) PTO_BLOCKS_FORMATS=+q5_0,q5_1,q5_k python3 -m pytest -q -p no:cacheprovider tests/gpu/test_quant_gpu.py \
                -k q5 2>&1 | tail -2
              for f in "" "+q5_0,q5_1,q5_k"; do
                for c in "llama3-8b:q5_k" "smollm2-135m:q5_0,q5_1"; do
                  PTO_BLOCKS_FORMATS="$f" python3 bench/decode.py --configs "${c%%:*}" --batches 1 --long 0 --steps 32 \
                    --executors waves --hf-configs none --prefill 0 --quant "${c#*:}" \
                    --json "$OUT/q5blocks_${c%%:*}_${f:+on}.json" 2>&1 | grep "B=1" | sed "s/^/[${f:-default}] /"
                done
              done ;;
    qprefill) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_quant_gpu.py tests/gpu/test_decode_gpu.py \
                -k prefill 2>&1 | tail -2
           python3 bench/prefill_profile.py --specs bf16,q4_1/q8_0 --ways dequantize,native --repeat 10 --top 0 \
             2>&1 | grep "prefill ms\|profiled"
           for c in "smollm2-135m:bf16,q4_1/q8_0,q5_0" "llama3-8b:bf16,q4_k/q6_k,q8_0"; do
             python3 bench/decode.py --configs "${c%%:*}" --batches 1 --long 0 --steps 8 --executors waves \
               --hf-configs none --prefill 512 --quant "${c#*:}" --quant-prefill dequantize,native \
               > "$OUT/qprefill_${c%%:*}.log" 2>&1
             python3 -c 'import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(r["config"], r["quant"], {k: v for k, v in r.items() if k.startswith("prefill")})' \
               "$OUT/qprefill_${c%%:*}.log"
           done ;;
    order) # a process's fourth CUDA graph slows every many-kernel replay (bench/step_order.py; found on
           # the H200, 2026-12-02): still so on this driver? (six steps, then a step and 3 throwaway graphs)
           nvidia-smi --query-gpu=driver_version --format=csv,noheader
           # (bare: torch's capture without torch.cuda.graph's synchronize, collect and empty_cache; emptied:
           # bare after torch.cuda.empty_cache(). Run by hand on 2026-12-02: --graph-kind pool (one shared pool)
           # slows it as torch's does; raw (empty graphs through the driver) and driver (torch's kernels
           # captured and instantiated through the driver, --graph-flags 0, 1, 9) do not)
           for v in "--steps 6" "--steps 1 --graphs 3" "--steps 1 --graphs 3 --graph-kind bare" \
                    "--steps 1 --graphs 3 --graph-kind emptied" "--steps 1 --graphs 3 --graph-kind emptied --graph-kernels 1"; do
             echo "[step_order $v]"; timeout 150 python3 bench/step_order.py $v 2>&1 | grep '^{' | cut -c1-120
           done ;;
    q41warps) # issue 46: SmolLM2's Q4_1 residual GEMVs (o, down) 0.5-0.8 us a layer behind bf16's after their
              # waits: their warps, kernel by kernel (a process per setting: the first steps of a process)
              for w in ${Q41_WARPS:-1 2 4}; do
                PTO_QGEMV_WARPS=$w python3 bench/decode.py --configs smollm2-135m --batches 1 --long 0 --steps 32 \
                  --executors waves --hf-configs none --prefill 0 --quant bf16,q4_1/q8_0 --timeline \
                  > "$OUT/q41warps_$w.log" 2>&1
                echo "[PTO_QGEMV_WARPS=$w]"; grep "B=1:" "$OUT/q41warps_$w.log" | cut -c1-120
                grep -A8 "q4_1/q8_0 B=1 waves: span" "$OUT/q41warps_$w.log" | grep "span\|gemv" | cut -c1-110
              done ;;
    q41by) # issue 46: SmolLM2's Q4_1 residual GEMVs at four warps, the rest by the rule (PTO_QGEMV_WARPS's
           # FUNCTION=N entries; the twenty-fourth session: o 1.95 -> 1.54 us a layer at four, gate/up and q/k/v
           # slower at four), against the default; a process a setting, twice, alternated (two steps each)
           for i in 1 2; do for w in 1 "1,gemv_residual_tile_o=4,gemv_residual_tile=4"; do
             PTO_QGEMV_WARPS=$w python3 bench/decode.py --configs smollm2-135m --batches 1 --long 0 --steps 64 \
               --executors waves --hf-configs none --prefill 0 --quant bf16,q4_1/q8_0 --timeline > "$OUT/q41by.log" 2>&1
             echo "[PTO_QGEMV_WARPS=$w]"; grep "B=1:" "$OUT/q41by.log" | cut -c1-100
             grep -A8 "q4_1/q8_0 B=1 waves: span" "$OUT/q41by.log" | grep "span\|residual" | cut -c1-110
           done; done ;;
    inline) # issue 45: the item that alone waits on a counter (one combine a layer) run where its count
            # ends (PTO_MK_INLINE=on, off by default): the GPU test, then the steps alternated
            python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode_gpu.py -k inline_items 2>&1 | tail -2
            python3 bench/megakernel.py --configs "${INLINE_CONFIGS:-smollm2-135m,llama3.2-1b,llama3-8b}" --batches 1 \
              --waves "" --variants ';i=on;;i=on' --budget "${INLINE_BUDGET:-300}" --json "$OUT/inline.json" \
              > "$OUT/inline.log" 2>&1
            grep -E " ms  floor|skipped|wait" "$OUT/inline.log" | cut -c1-160 ;;
    q41) # issue 46: the 8B's Q4_1 prefill both ways (is "auto" native for q4_1 right on a GPU?), then
         # SmolLM2's Q4_1 step against bf16 kernel by kernel, in one process (twice)
         python3 -m pytest -q -p no:cacheprovider tests/gpu/test_quant_gpu.py -k "blocks or prefill" 2>&1 | tail -2
         for c in "llama3-8b:bf16,q4_1" "smollm2-135m:bf16,q4_1/q8_0"; do
           python3 bench/decode.py --configs "${c%%:*}" --batches 1 --long 0 --steps 8 --executors waves \
             --hf-configs none --prefill 512 --quant "${c#*:}" --quant-prefill dequantize,native,auto \
             > "$OUT/q41_prefill_${c%%:*}.log" 2>&1
           python3 -c 'import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(r["config"], r["quant"], {k: v for k, v in r.items() if k.startswith("prefill")})' \
             "$OUT/q41_prefill_${c%%:*}.log"
         done
         for i in 1 2; do
           python3 bench/decode.py --configs smollm2-135m --batches 1 --long 0 --steps 32 --executors waves \
             --hf-configs none --prefill 0 --quant bf16,q4_1/q8_0,bf16,q4_1/q8_0 --timeline > "$OUT/q41_tl_$i.log" 2>&1
           grep "B=1" "$OUT/q41_tl_$i.log" | cut -c1-160
         done
         grep -A14 "span" "$OUT/q41_tl_1.log" | cut -c1-110 ;;
    combo) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode_gpu.py -k combine_in_the_o 2>&1 | tail -2
           T="${COMBO_TILINGS:-default;+fold_combine=8;+fold_combine=16;+fold_combine=32}"
           python3 bench/megakernel.py --configs "${COMBO_CONFIGS:-smollm2-135m,llama3.2-1b}" --batches 1 \
             --variants '' --tilings "$T" --waves "$T" --budget 330 --json "$OUT/combo.json" > "$OUT/combo.log" 2>&1
           grep -E " ms  floor|skipped" "$OUT/combo.log" ;;
    ffnfold) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode_gpu.py -k one_level 2>&1 | tail -2
          python3 bench/ffn_fold.py --configs "${FOLD_CONFIGS:-smollm2-135m}" --json "$OUT/ffn_fold.json" \
            > "$OUT/ffn_fold.log" 2>&1; tail -8 "$OUT/ffn_fold.log"
          T="${FOLD_TILINGS:-default;+fold_down=8;+fold_down=4}"
          python3 bench/megakernel.py --configs "${FOLD_CONFIGS:-smollm2-135m}" --batches "${FOLD_BATCHES:-1,2}" \
            --variants '' --tilings "$T" --waves "$T" --budget 300 --json "$OUT/fold.json" > "$OUT/fold.log" 2>&1
          grep -E " ms  floor|skipped" "$OUT/fold.log" ;;
    smolattn) python3 bench/megakernel.py --configs smollm2-135m --waves "" --variants '' \
                --tilings "${SMOLATTN_TILINGS:-default;+chunk=256;+chunk=512;+chunk=1024}" --budget 240 \
                --json "$OUT/smolattn.json" > "$OUT/smolattn.log" 2>&1; grep -A1 "ms  floor" "$OUT/smolattn.log" ;;
    quantsplit) V1="+bn=16,bk=1024,o_bn=16,o_bk=none,qkv_bn=8,qkv_bk=none,ffn_bn=8,ffn_bk=1024,lm_bk=64,bv=512"
                for split in off auto; do
                  PTO_MK_SPLIT=$split python3 bench/decode.py --configs llama3-8b --batches 1 --long 0 --steps 32 \
                    --executors persistent --hf-configs none --quant "${QUANTSPLIT_TYPES:-llama3-8b:q4_k/q6_k,fp8}" \
                    --prefill 0 --tilings "$V1" --json "$OUT/quantsplit_$split.json" > "$OUT/quantsplit_$split.log" 2>&1
                  echo "split=$split"; grep "B=1" "$OUT/quantsplit_$split.log" | cut -c1-300
                done ;;
    persm) python3 bench/megakernel.py --configs "${PERSM_CONFIGS:-llama3.2-1b}" --waves "" \
             --variants ';s=3,r=396;s=3,r=396,f=1' --budget 240 --json "$OUT/persm.json" > "$OUT/persm.log" 2>&1
           grep "ms  floor" "$OUT/persm.log" ;;
    runpf) python3 bench/megakernel.py --configs "${RUNPF_CONFIGS:-llama3.2-1b,llama3-8b}" --waves "" \
             --variants ';f=1;f=1,k=128;f=1,k=256;f=light' --budget 260 --json "$OUT/runpf.json" > "$OUT/runpf.log" 2>&1
           grep "ms  floor" "$OUT/runpf.log"
           python3 bench/megakernel.py --configs llama3.2-1b,llama3-8b --waves "" --variants ';f=1' \
             --tilings 'default;+ffn_bk=1024;+ffn_bk=1024,qkv_bk=512' --budget 200 --json "$OUT/runpf_bk.json" \
             > "$OUT/runpf_bk.log" 2>&1; grep "ms  floor" "$OUT/runpf_bk.log" ;;
    deps) python3 -m pytest -q tests/gpu/test_decode_gpu.py -k data_dependencies > "$OUT/deps_tests.log" 2>&1
          tail -2 "$OUT/deps_tests.log"
          python3 bench/megakernel.py --configs "${DEPS_CONFIGS:-smollm2-135m,llama3.2-1b,llama3-8b}" --waves "" \
            --variants ';w=data' --budget 300 --json "$OUT/deps.json" > "$OUT/deps.log" 2>&1
          grep "ms  floor" "$OUT/deps.log"
          for w in task data; do
            PTO_MK_DEPS=$w python3 bench/decode.py --configs "${DEPS_CONFIGS:-smollm2-135m,llama3.2-1b,llama3-8b}" \
              --batches 8 --long 0 --steps 32 --executors persistent --hf-configs none --tilings default \
              --json "$OUT/deps_b8_$w.json" > "$OUT/deps_b8_$w.log" 2>&1; echo "deps=$w"; grep "B=" "$OUT/deps_b8_$w.log"
          done ;;
    intdots) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_quant_gpu.py > "$OUT/intdots_tests.log" 2>&1
             tail -n 3 "$OUT/intdots_tests.log"
             python3 bench/decode.py --configs llama3-8b --batches 1 --long 0 --steps 32 --executors waves \
               --hf-configs none --quant 'llama3-8b:q4_k/q6_k,q6_k' --prefill 0 --tilings 'auto:default;int16:default' \
               --json "$OUT/intdots_q6k.json" > "$OUT/intdots_q6k.log" 2>&1; grep "B=1" "$OUT/intdots_q6k.log" | cut -c1-300
             python3 bench/decode.py --configs llama3-8b --batches 1 --long 0 --steps 32 --executors waves \
               --hf-configs none --quant 'q8_0' --prefill 0 \
               --tilings "${INTDOT_O_TILINGS:-auto:default;auto:o_bn=4;auto:o_bn=16,o_bk=2048;auto:o_bk=2048}" \
               --json "$OUT/intdots_o.json" > "$OUT/intdots_o.log" 2>&1; grep "B=1" "$OUT/intdots_o.log" | cut -c1-400 ;;
    halfdots) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_quant_gpu.py -k "half or fp8 or q6_k" \
                > "$OUT/halfdots_tests.log" 2>&1; tail -n 3 "$OUT/halfdots_tests.log"
              python3 bench/qgemv.py --specs fp8 --shapes o,down,gate_up,head --tiles 'units:default;auto:default' \
                --json "$OUT/halfdots_qgemv.json" > "$OUT/halfdots_qgemv.log" 2>&1; tail -n 12 "$OUT/halfdots_qgemv.log"
              python3 bench/decode.py --configs llama3-8b --batches 1 --long 0 --steps 32 --executors waves \
                --hf-configs none --quant 'fp8,q8_0' --prefill 0 --qgemv units,auto \
                --json "$OUT/halfdots_8b.json" > "$OUT/halfdots_8b.log" 2>&1; grep "B=1" "$OUT/halfdots_8b.log" | cut -c1-300
              python3 bench/decode.py --configs llama3-8b --batches 1 --long 0 --steps 32 --executors waves \
                --hf-configs none --quant 'q8_0' --prefill 0 --tilings 'auto:default;auto:o_bn=16,o_bk=2048' \
                --json "$OUT/halfdots_o.json" > "$OUT/halfdots_o.log" 2>&1; grep "B=1" "$OUT/halfdots_o.log" | cut -c1-300
              python3 bench/decode.py --configs smollm2-135m --batches 1 --long 0 --steps 64 --executors waves \
                --hf-configs none --quant 'bf16,q4_1,smollm2-135m:q4_1/q8_0,fp8' --prefill 0 \
                --json "$OUT/halfdots_smol.json" > "$OUT/halfdots_smol.log" 2>&1; grep "B=1" "$OUT/halfdots_smol.log" | cut -c1-300 ;;
    blocks) n=0
            for p in ${BLOCKS:-off blocks off blocks}; do
              n=$((n + 1))
              PTO_PERSISTENT=$p python3 bench/decode.py --configs llama3-8b,llama3.2-1b --batches 1 --long 0 --steps 32 \
                --executors waves --hf-configs none --prefill 0 --quant 'bf16,q4_k/q6_k,q8_0,fp8' \
                --json "$OUT/blocks_${n}_$p.json" >> "$OUT/blocks_$p.log" 2>&1
              echo "PTO_PERSISTENT=$p"; grep -h "B=1" "$OUT/blocks_$p.log" | tail -n 8 | cut -c1-110
            done ;;
    forms) for i in 1 2; do
             python3 bench/qgemv_forms.py --specs "${FORMS_SPECS:-q4_k/q6_k,q8_0,fp8}" --iters 200 \
               --json "$OUT/forms_$i.json" > "$OUT/forms_$i.log" 2>&1; cut -c1-100 "$OUT/forms_$i.log"
           done ;;
    chain) python3 bench/gluon_chain.py ${CHAIN_ARGS:---d 2048,2048,4096,4096 --rows 16,8,32,16} --json "$OUT/chain.json" > "$OUT/chain.log" 2>&1
           tail -n 40 "$OUT/chain.log" ;;
    llchain) # issue 45: a layer's wait by the counter (the megakernel's) against x passed as flagged words
             # (NCCL's LL), the weights loaded before either; at SmolLM2's width and the 1B's half
             python3 bench/gluon_chain.py --d "${LL_D:-576,576,1024}" --rows "${LL_ROWS:-8,4,8}" --layers 32 --bk 64 \
               --ways pre,ll,lpdl,lll --warps "${LL_WARPS:-4,8}" --waits on,off --json "$OUT/llchain.json" 2>&1 | tail -60 ;;
    q41tile) # issue 46: the residual GEMVs' tiles (bench/qgemv_sass.py: the default o tile, 4 rows x 1,024
             # columns for K 576, puts a warp a row where x's quantization puts the warps over the groups:
             # 18 barriers at four warps, the plain GEMVs' rule; 8 rows x 512 columns 8), every tiling in one
             # process after three throwaway graphs (--settle: all timed past the fourth graph), twice
             for i in 1 2; do
               python3 bench/decode.py --configs smollm2-135m --batches 1 --long 0 --steps 64 \
                 --executors waves --hf-configs none --prefill 0 --quant bf16,q4_1/q8_0 --settle --timeline \
                 --tilings "${Q41_TILINGS:-default;o_bn=8,o_bk=512;bn=8,bk=1024;o_bn=8,o_bk=512,bn=8,bk=1024}" \
                 > "$OUT/q41tile.log" 2>&1
               echo "[round $i]"; grep "B=1: " "$OUT/q41tile.log" | cut -c1-400
               grep -A12 "B=1.*span" "$OUT/q41tile.log" | grep "span\|residual" | cut -c1-110
             done ;;
    gluonq4) python3 bench/gluon_q4.py --json "$OUT/gluon_q4.json" 2>&1 | tee "$OUT/gluon_q4.log" | cut -c1-200
             python3 bench/qgemv.py --specs q4_1/q8_0,q4_k/q6_k --shapes o,down,gate_up --tiles 'int16:default' \
               --json "$OUT/gluon_q4_pto.json" > "$OUT/gluon_q4_pto.log" 2>&1; tail -n 16 "$OUT/gluon_q4_pto.log" | cut -c1-200 ;;
    tuneship) entry=${TS_PROGRAM:-llama/llama3-8b}; seq=${TS_SEQ:-4096}; rm -rf /tmp/tune_pto /tmp/tuneship_cache
              prog=${entry%%/*}; cfg=7b; [ "$prog" = llama ] && cfg=llama3-8b  # (the tune stage's defaults)
              case $entry in */*) cfg=${entry#*/} ;; esac
              # (the layer's runs in a cache of their own: a tuned database in the usual one is not "as shipped")
              layer() { PTO_CACHE_DIR=/tmp/tuneship_cache python3 -m pto.cli bench "$prog" --config "$cfg" --dtype bf16 \
                          --iterations 20 --seq "$seq" --executor waves --rounds 3 --compare compile \
                          --json "$OUT/tuneship_$1.json" > "$OUT/tuneship_$1.log" 2>&1
                        echo "[$1]"; tail -4 "$OUT/tuneship_$1.log" | cut -c1-200; }
              layer shipped
              PTO_CACHE_DIR=/tmp/tune_pto python3 -m pto.cli tune "$prog" --config "$cfg" --seq "$seq" \
                --budget-s "${TS_BUDGET:-300}" --json "$OUT/tuneship_tune.json" > "$OUT/tuneship_tune.log" 2>&1
              echo "tune rc=$?"; tail -12 "$OUT/tuneship_tune.log" | cut -c1-200
              for d in /tmp/tune_pto/schedules/*/; do
                [ -d "$d" ] || continue
                tar -C /tmp/tune_pto/schedules -czf "$OUT/schedules_$(basename "$d").tar.gz" "$(basename "$d")"
                python3 bench/ship_schedules.py "$d" 2>&1 | tail -20
              done
              layer tuned ;;
    lmbk) for i in 1 2; do
            python3 bench/decode.py --configs llama3-8b --batches 1 --long 0 --steps 32 --executors waves \
              --hf-configs none --prefill 0 --quant 'q4_k/q6_k,q8_0,fp8' --tilings 'default;lm_bk=1024' --timeline \
              --json "$OUT/lmbk_$i.json" > "$OUT/lmbk_$i.log" 2>&1
            echo "[round $i]"; grep "B=1: " "$OUT/lmbk_$i.log" | cut -c1-300
            grep -A30 "B=1.*span" "$OUT/lmbk_$i.log" | grep "span\|lmhead" | cut -c1-110
          done ;;
    q6head) for ex in waves persistent; do
              python3 -m pto.cli run model --config "${Q6H_CONFIG:-llama3-8b}" --quantize q6_k --cache 512 --executor $ex --check \
                > "$OUT/q6head_check_$ex.log" 2>&1; tail -3 "$OUT/q6head_check_$ex.log" | cut -c1-200
            done
            python3 bench/decode.py --configs llama3.2-1b,llama3-8b --batches 1 --long 0 --steps 32 --executors waves \
              --hf-configs none --prefill 0 --quant 'q4_k/q6_k' --tilings "${Q6H_TILINGS:-default;lm_bk=2048}" --timeline --settle \
              --json "$OUT/q6head.json" > "$OUT/q6head.log" 2>&1
            grep "B=1: " "$OUT/q6head.log" | cut -c1-300
            grep -A30 "B=1.*span" "$OUT/q6head.log" | grep "span\|lmhead" | cut -c1-110 ;;
    downblocks) for p in off blocks; do
                  PTO_PERSISTENT=$p python3 bench/qgemv.py --specs q4_k/q6_k,q4_1/q8_0,q8_0,fp8 --shapes down \
                    --tiles 'auto:default;auto:bn=1,bk=16384;auto:bn=2,bk=16384;auto:bn=4,bk=16384' \
                    --json "$OUT/downblocks_$p.json" > "$OUT/downblocks_$p.log" 2>&1
                  echo "[PTO_PERSISTENT=$p]"; tail -n 18 "$OUT/downblocks_$p.log" | cut -c1-200
                  PTO_PERSISTENT=$p python3 bench/qgemv.py --specs q4_k/q6_k,q4_1/q8_0 --shapes o \
                    --tiles 'auto:default;auto:o_bn=2;auto:o_bn=4' --json "$OUT/oblocks_$p.json" > "$OUT/oblocks_$p.log" 2>&1
                  tail -n 8 "$OUT/oblocks_$p.log" | cut -c1-200
                done ;;
    downstep) for f in none gemv_residual_tile; do
                PTO_BLOCKS_FUNCTIONS=${f#none} python3 bench/decode.py --configs llama3-8b --batches 1 --long 0 \
                  --steps 32 --executors waves --hf-configs none --prefill 0 --quant "${DOWNSTEP_QUANT:-fp8,q8_0}" --timeline --settle \
                  --tilings "${DOWNSTEP_TILINGS:-default}" --json "$OUT/downstep_$f.json" > "$OUT/downstep_$f.log" 2>&1
                echo "[PTO_BLOCKS_FUNCTIONS=${f#none}]"; grep "B=1: " "$OUT/downstep_$f.log" | cut -c1-300
                grep -A30 "B=1.*span" "$OUT/downstep_$f.log" | grep "span\|gemv_residual_tile__" | cut -c1-110
              done ;;
    quant8) python3 bench/decode.py --configs llama3-8b --batches 1,8 --long 0 --steps 16 --executors waves \
              --hf-configs none --quant 'llama3-8b:q4_k/q6_k,fp8' --prefill 0 --kernels \
              --json "$OUT/quant8.json" > "$OUT/quant8.log" 2>&1; tail -n 40 "$OUT/quant8.log" | cut -c1-300 ;;
    qwarps) for w in ${QWARPS:-1 2 4}; do
              PTO_QGEMV_WARPS=$w python3 bench/decode.py --configs smollm2-135m --batches 1 --long 0 --steps 64 \
                --executors waves --hf-configs none --quant 'bf16,smollm2-135m:q4_1/q8_0,q8_0' --prefill 0 \
                --json "$OUT/qwarps_smol_$w.json" > "$OUT/qwarps_smol_$w.log" 2>&1
              PTO_QGEMV_WARPS=$w python3 bench/decode.py --configs llama3-8b --batches 1 --long 0 --steps 32 \
                --executors waves --hf-configs none --quant 'llama3-8b:q4_k/q6_k,q8_0,fp8' --prefill 0 \
                --json "$OUT/qwarps_8b_$w.json" > "$OUT/qwarps_8b_$w.log" 2>&1
              echo "PTO_QGEMV_WARPS=$w"; grep -h "B=1" "$OUT/qwarps_smol_$w.log" "$OUT/qwarps_8b_$w.log" | cut -c1-160
            done ;;
    qcols) for c in ${QCOLS:-1024 2048 1024 2048}; do
             PTO_QGEMV_COLS=$c python3 bench/decode.py --configs llama3-8b,llama3.2-1b --batches 1 --long 0 --steps 32 \
               --executors waves --hf-configs none --quant 'q4_k/q6_k,q8_0,fp8' --prefill 0 \
               --json "$OUT/qcols_$c.json" >> "$OUT/qcols_$c.log" 2>&1
             echo "PTO_QGEMV_COLS=$c"; grep -h "B=1" "$OUT/qcols_$c.log" | tail -n 6 | cut -c1-160
           done
           PTO_PDL=off PTO_QGEMV_COLS=${QCOLS_PROFILE:-2048} python3 bench/decode.py --configs llama3-8b --batches 1 \
             --long 0 --steps 32 --executors waves --hf-configs none --quant 'bf16,q4_k/q6_k' --prefill 0 --kernels \
             --json "$OUT/qcols_kernels.json" > "$OUT/qcols_kernels.log" 2>&1
           tail -n 60 "$OUT/qcols_kernels.log" | cut -c1-200
           PTO_QGEMV_COLS=${QCOLS_PROFILE:-2048} timeout 200 python3 -m pytest -q -p no:cacheprovider \
             tests/gpu/test_quant_gpu.py > "$OUT/qcols_tests.log" 2>&1; tail -n 3 "$OUT/qcols_tests.log" ;;
    quantmk) python3 bench/decode.py --configs llama3-8b --batches 1 --long 0 --steps 32 --executors waves,persistent \
               --hf-configs none --quant "${QUANTMK_TYPES:-llama3-8b:q4_k/q6_k,q8_0,fp8}" --prefill 0 --tilings auto:default \
               --json "$OUT/quantmk.json" > "$OUT/quantmk.log" 2>&1; tail -n 4 "$OUT/quantmk.log" | cut -c1-600 ;;
    pdllate) # issues 45, 46: a quantized o projection's early loads against the combine they overlap
             # (PTO_PDL_LATE: the named functions load nothing before their wait, so none is chained for)
             for late in none gemv_residual_tile,gemv_residual_tile_o; do
               tag=${late%%,*}
               PTO_PDL_LATE=${late#none} python3 bench/decode.py --configs llama3-8b --batches 1 --long 0 --steps 32 \
                 --executors waves --hf-configs none --quant "${LATE_TYPES:-bf16,q4_k/q6_k,q8_0,fp8}" --prefill 0 \
                 --settle --timeline --json "$OUT/pdllate_8b_$tag.json" > "$OUT/pdllate_8b_$tag.log" 2>&1
               PTO_PDL_LATE=${late#none} python3 bench/decode.py --configs smollm2-135m --batches 1 --long 0 \
                 --steps 64 --executors waves --hf-configs none --quant 'bf16,smollm2-135m:q4_1/q8_0' --prefill 0 \
                 --settle --timeline --json "$OUT/pdllate_smol_$tag.json" > "$OUT/pdllate_smol_$tag.log" 2>&1
               echo "[PTO_PDL_LATE=${late#none}]"; grep -h "B=1" "$OUT/pdllate_8b_$tag.log" "$OUT/pdllate_smol_$tag.log" \
                 | cut -c1-200
               grep -h "combine\|gemv_residual\|span" "$OUT/pdllate_8b_$tag.log" | cut -c1-130 | head -n 40
             done ;;
    qscales) # issue 46: the dot path's scale planes loaded a value a group (measured 2026-12-04: PERF.md, thirty-third)
             for round in 1 2; do
               for qs in units groups; do
                 PTO_QSCALES=$qs python3 bench/decode.py --configs llama3-8b,llama3.2-1b --batches "${QS_BATCHES:-8,1}" \
                   --long 0 --steps 32 --executors waves --hf-configs none --prefill 0 --settle \
                   --quant "${QS_TYPES:-llama3-8b:q4_k/q6_k,llama3-8b:q8_0,llama3.2-1b:q4_k/q6_k}" \
                   --json "$OUT/qscales_${qs}_$round.json" > "$OUT/qscales_${qs}_$round.log" 2>&1
                 echo "[PTO_QSCALES=$qs, round $round]"; grep -h " B=" "$OUT/qscales_${qs}_$round.log" | cut -c1-120
               done
             done
             for qs in units groups; do  # (the prefill's GEMMs load through the same helper)
               PTO_QSCALES=$qs python3 bench/decode.py --configs smollm2-135m --batches 1 --long 0 --steps 8 \
                 --executors waves --hf-configs none --quant 'smollm2-135m:q4_1/q8_0' --prefill 512 \
                 --quant-prefill native > "$OUT/qscales_prefill_$qs.log" 2>&1
               echo "[PTO_QSCALES=$qs prefill]"; grep -h "prefill" "$OUT/qscales_prefill_$qs.log" | tail -n 1 | cut -c1-200
             done ;;
    runloop) # issues 45, 46: the megakernel's runs by form (measured 2026-12-04: PERF.md, thirty-fourth)
             RLQ=${RL_QUANT:-llama3-8b:q4_k/q6_k,llama3-8b:q8_0,llama3-8b:fp8,llama3.2-1b:q4_k/q6_k,smollm2-135m:q4_1/q8_0}
             RLC=${RL_CONFIGS:-llama3-8b,llama3.2-1b,smollm2-135m}
             python3 -m pytest -q -p no:cacheprovider tests/gpu/test_quant_gpu.py -k persistent 2>&1 | tail -2
             if [ "${RL_WAVES:-0}" = 1 ]; then
               python3 bench/decode.py --configs "$RLC" --batches 1 --long 0 --steps 32 --executors waves \
                 --hf-configs none --prefill 0 --quant "bf16,$RLQ" > "$OUT/runloop_waves.log" 2>&1
               echo "[waves]"; grep -h " B=" "$OUT/runloop_waves.log" | cut -c1-100
             fi
             for round in 1 2; do
               for rl in ${RL_FORMS:-blocks steps}; do
                 env ${RL_ENV:-} PTO_MK_RUNLOOP=$rl python3 bench/decode.py --configs "$RLC" --batches 1 --long 0 \
                   --steps 32 --executors persistent --hf-configs none --prefill 0 --quant "$RLQ" \
                   --json "$OUT/runloop_q_${rl}_$round.json" > "$OUT/runloop_q_${rl}_$round.log" 2>&1
                 echo "[PTO_MK_RUNLOOP=$rl, round $round]"; grep -h " B=" "$OUT/runloop_q_${rl}_$round.log" | cut -c1-100
                 [ "${RL_BF16:-0}" = 1 ] || continue
                 env ${RL_ENV:-} PTO_MK_RUNLOOP=$rl python3 bench/decode.py --configs "$RLC" --batches 1 --long 0 \
                   --steps 32 --executors persistent --hf-configs none \
                   --json "$OUT/runloop_bf16_${rl}_$round.json" > "$OUT/runloop_bf16_${rl}_$round.log" 2>&1
                 grep -h " B=" "$OUT/runloop_bf16_${rl}_$round.log" | cut -c1-100
               done
             done ;;
    kahead) # issue 46 (measured 2026-12-04: PERF.md, thirty-fifth)
            KAQ=${KA_QUANT:-llama3-8b:q4_k/q6_k,llama3-8b:q8_0,llama3-8b:fp8,llama3.2-1b:q4_k/q6_k,smollm2-135m:q4_1/q8_0}
            for m in ${KA_TESTS-on first}; do  # (KA_TESTS="": none)
              echo "[tests, PTO_K_AHEAD=$m]"
              PTO_K_AHEAD=$m python3 -m pytest -q -p no:cacheprovider tests/gpu/test_quant_gpu.py \
                -k "waves and (k_quants or smollm2) and (q4_k or q8_0 or fp8)" 2>&1 | tail -2
            done
            for round in 1 2; do
              for mode in ${KA_MODES:-off on}; do
                PTO_K_AHEAD=$mode python3 bench/decode.py --configs llama3-8b,llama3.2-1b,smollm2-135m --batches 1 \
                  --long 0 --steps 32 --executors waves --hf-configs none --prefill 0 --settle --timeline \
                  --quant "$KAQ" --json "$OUT/kahead_${mode}_$round.json" > "$OUT/kahead_${mode}_$round.log" 2>&1
                echo "[PTO_K_AHEAD=$mode, round $round]"; grep -h " B=" "$OUT/kahead_${mode}_$round.log" | cut -c1-90
                grep -h "B=1 waves: span\|gemv_residual_tile__K\|lmhead" "$OUT/kahead_${mode}_$round.log" | cut -c1-110
              done
            done ;;
    variants) IFS=';' read -ra vs <<< "${VARIANTS:-base||default}"
              for round in 1 2; do
                for v in "${vs[@]}"; do
                  IFS='|' read -r name envs til <<< "$v"
                  env $envs python3 bench/decode.py --configs "${V_CONFIGS:-llama3-8b}" --batches 1 --long 0 \
                    --steps 32 --executors waves --hf-configs none --prefill 0 --settle --timeline \
                    --quant "${V_QUANT:-fp8}" --tilings "${til:-default}" --json "$OUT/v_${name}_$round.json" \
                    > "$OUT/v_${name}_$round.log" 2>&1
                  echo "[$name, round $round] rc=$?"; grep -h " B=1: waves" "$OUT/v_${name}_$round.log" | cut -c1-70
                done
              done ;;
    mkwarps) # issue 45 (measured 2026-12-04: PERF.md, thirty-fifth)
             mk_envs "${MKW_ENVS:-PTO_MK_WARPS=8 PTO_PER_SM=2;PTO_MK_WARPS=8;PTO_MK_WARPS=2 PTO_PER_SM=4}" \
               "${RL_QUANT:-llama3-8b:q4_k/q6_k,llama3-8b:q8_0,llama3.2-1b:q4_k/q6_k,smollm2-135m:q4_1/q8_0}" mkwarps ;;
    mkregs) # issue 45: the register-saving forms (bench/megakernel_sass.py, PERF.md thirty-eighth) checked, then timed
            env $MKR_ENV python3 -m pytest -q -p no:cacheprovider tests/gpu/test_megakernel_gpu.py \
              tests/gpu/test_quant_gpu.py tests/gpu/test_decode_gpu.py::test_more_makes_room_while_the_megakernel_does_not_spill \
              -k "persistent or more_makes_room or auto_calls" > "$OUT/mkregs_tests.log" 2>&1
            echo "[$MKR_ENV] tests rc=$?"; tail -2 "$OUT/mkregs_tests.log"
            mk_envs "${MKW_ENVS:-$MKR_ENV}" \
              "${RL_QUANT:-bf16,llama3-8b:q4_k/q6_k,llama3-8b:q8_0,llama3.2-1b:q4_k/q6_k,smollm2-135m:q4_1/q8_0}" mkregs ;;
    records) mkdir -p "$OUT/records"  # (static dispatch only: the device tool returns a handful of files a call)
             python3 bench/megakernel.py --configs "${RECORDS_CONFIGS:-smollm2-135m,llama3.2-1b,llama3-8b}" --waves "" \
               --variants "${RECORDS_VARIANTS:-d=static}" --batches "${RECORDS_BATCHES:-1}" --budget 240 \
               --records "$OUT/records" \
               --json "$OUT/records.json" > "$OUT/records.log" 2>&1
             ls "$OUT/records" ;;
    tune) rm -rf /tmp/tune_pto
          for entry in ${TUNE_PROGRAMS:-llama7b:16384,4096,1537}; do
            case $entry in *:*) ;; *) echo "tune: $entry is not PROGRAM[/CONFIG]:SEQS"; continue ;; esac
            prog=${entry%%:*}; cfg=7b; [ "${prog%%/*}" = llama ] && cfg=llama3-8b
            case $prog in */*) cfg=${prog#*/}; prog=${prog%%/*} ;; esac
            tag=${entry//[:,\/]/_}
            PTO_CACHE_DIR=/tmp/tune_pto python3 -m pto.cli tune "$prog" --config $cfg --seq "${entry#*:}" \
              --budget-s "${TUNE_BUDGET:-480}" --json "$OUT/tune_$tag.json" > "$OUT/tune_$tag.log" 2>&1
            echo "rc=$? $entry"; tail -4 "$OUT/tune_$tag.log"
          done
          for d in /tmp/tune_pto/schedules/*/; do  # (one archive: a call returns at most 8 files)
            [ -d "$d" ] || continue
            tar -C /tmp/tune_pto/schedules -czf "$OUT/schedules_$(basename "$d").tar.gz" "$(basename "$d")"
            tar -tzf "$OUT/schedules_$(basename "$d").tar.gz"
          done ;;
    cold) ( export PTO_CACHE_DIR=/tmp/cold_pto; rm -rf /tmp/cold_pto /tmp/cold_triton*
            TIMEFORMAT="empty pto and Triton caches, seq 3333: %R s wall"
            time TRITON_CACHE_DIR=/tmp/cold_triton0 python3 -m pto.cli run llama7b --config 7b --seq 3333 > /dev/null
            for t in 1 16; do
              TIMEFORMAT="empty Triton cache, PTO_COMPILE_THREADS=$t, seq 3335: %R s wall"
              time PTO_COMPILE_THREADS=$t TRITON_CACHE_DIR=/tmp/cold_triton$t python3 -m pto.cli run llama7b \
                --config 7b --seq 3335 > /dev/null
            done
            TIMEFORMAT="warm caches, a new shape (seq 3334): %R s wall"
            time TRITON_CACHE_DIR=/tmp/cold_triton16 python3 -m pto.cli run llama7b --config 7b --seq 3334 > /dev/null
          ) 2>&1 | tee "$OUT/cold.log" ;;
    tp) IFS=';' read -ra runs <<< "${TP_RUNS:---collectives auto,group}"; n=0
        for r in "${runs[@]}"; do
          n=$((n + 1)); read -ra words <<< "$r"; envs=(); flags=()
          for w in "${words[@]}"; do [[ $w == *=* && $w != --* ]] && envs+=("$w") || flags+=("$w"); done
          echo "tp run $n: $r"
          timeout "${TP_LIMIT:-240}" env "${envs[@]}" torchrun --nproc-per-node "${TP_N:-2}" bench/tp.py \
            --seq "${TP_SEQS:-4096,16384}" --json "$OUT/tp_$n.json" "${flags[@]}" > "$OUT/tp_$n.log" 2>&1
          echo "rc=$?"; grep "^|" "$OUT/tp_$n.log"
        done ;;
    tpdecode) timeout "${TP_LIMIT:-480}" torchrun --nproc-per-node "${TP_N:-2}" bench/decode.py --configs llama3-8b \
                --batches "${TP_BATCHES:-1,8}" --long 0 --steps 32 --collectives "${TP_COLLECTIVES:-auto,group}" \
                --lm-heads "${TP_HEADS:-parallel}" --json "$OUT/tpdecode.json" > "$OUT/tpdecode.log" 2>&1
              echo "rc=$?"; grep "^|" "$OUT/tpdecode.log" ;;
    allreduce) timeout "${TP_LIMIT:-240}" torchrun --nproc-per-node "${TP_N:-2}" bench/allreduce.py \
                 --json "$OUT/allreduce.json" > "$OUT/allreduce.log" 2>&1
               echo "rc=$?"; grep "^|\|^tp" "$OUT/allreduce.log" ;;
    long) python3 bench/decode.py --configs llama3.1-8b --batches 1 --cache 1024 --long 32768 --steps 16 \
            --executors waves --hf-configs none --kernels --json "$OUT/long.json" > "$OUT/long.log" 2>&1
          grep "B=" "$OUT/long.log" ;;
    dispatch) python3 -m pto.cli bench softmax --seq 65536 --executor waves,persistent --compare none \
                --json "$OUT/dispatch_softmax.json" > "$OUT/dispatch_softmax.log" 2>&1
              grep -o '"persistent_item_gap_us": [0-9.]*' "$OUT/dispatch_softmax.json"
              python3 bench/decode.py --configs smollm2-135m --batches 1 --long 0 --steps 16 \
                --executors waves,persistent --hf-configs none --json "$OUT/dispatch_decode.json" \
                > "$OUT/dispatch_decode.log" 2>&1; grep "B=" "$OUT/dispatch_decode.log"
              grep -o '"\(item_gap\|dependency_wait\)_us": [0-9.]*' "$OUT/dispatch_decode.json" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "=== done $(date +%T)"
