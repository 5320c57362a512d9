# SPDX-License-Identifier: Apache-2.0
# FedNova with secure aggregation equals FedNova in plain mode within the
# quantisation bound (issue 6): the same equivalence check as secagg.sh,
# 3 rounds of 4 workers, with aggregation.rule fednova. The workers put
# w_i d_i, w_i and w_i ||a_i||_1 into the masked vector; the coordinator
# never sees one worker's tau_i, ||a_i||_1 or sample count.
SECAGG_RULE=fednova SECAGG_ONLY_EQUIV=1 source tests/integration/secagg.sh
