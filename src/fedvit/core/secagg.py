"""What fedvit's SecAgg+ server and clients agree on beside Flower's protocol."""

# Flower's legacy API (which SecAgg+ needs) carries the model as a list of unnamed arrays; the server names them in
# each train instruction's config so that the client's Message-API handlers see the model's own names
ARRAY_NAMES = "fedvit-array-names"
# the client reports how many entries of its weighted model fell outside [-clipping-range, clipping-range]: SecAgg+
# clips them before quantising, which would change the aggregate without a word
CLIPPED_METRIC = "secagg-clipped-entries"
