# SPDX-License-Identifier: Apache-2.0
# heterogeneity.sh with encrypted sessions and secure aggregation on: time
# budgets, a straggler dropped at the deadline (its pairwise masks
# recovered from the others' shares) or waited for, over-selection, and
# FedNova's tau_eff from the masked sums.
HET_SECURE=1 source tests/integration/heterogeneity.sh
