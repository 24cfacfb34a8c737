// fleetcrawl's patch of FerretDB v1.24.2's find handler (project/ops/install.py applies it):
// a find sorted by `_id` whose filter bounds `_id` to a range of strings is sorted by the
// backend, in SQL (backends/sqlite/fleetcrawl_order.go), and not again in memory; its limit
// goes to SQL too when that range is the whole filter. A page then costs what it returns.

package handler

import (
	"github.com/FerretDB/FerretDB/internal/backends"
	"github.com/FerretDB/FerretDB/internal/handler/common"
	"github.com/FerretDB/FerretDB/internal/types"
	"github.com/FerretDB/FerretDB/internal/util/must"
)

// fleetcrawlPushdown pushes the sort by `_id` (and the limit) of params down into qp.
func fleetcrawlPushdown(h *Handler, params *common.FindParams, qp *backends.QueryParams) {
	if h.DisablePushdown || params.Sort.Len() != 1 || !params.Sort.Has("_id") || params.Skip != 0 {
		return
	}

	if qp.Filter.Len() == 0 || !qp.Filter.Has("_id") {
		return
	}

	op, ok := must.NotFail(qp.Filter.Get("_id")).(*types.Document)
	if !ok || op.Len() == 0 {
		return
	}

	for _, k := range op.Keys() {
		switch k {
		case "$gt", "$gte", "$lt", "$lte":
		default:
			return
		}

		if _, ok := must.NotFail(op.Get(k)).(string); !ok {
			return
		}
	}

	qp.Sort = params.Sort

	if params.Filter.Len() == 1 && qp.Filter.Len() == 1 {
		qp.Limit = params.Limit
	}
}

// fleetcrawlUnsorted returns params without the sort the backend did (fleetcrawlPushdown).
func fleetcrawlUnsorted(params *common.FindParams, qp *backends.QueryParams) *common.FindParams {
	if qp.Sort.Len() != 1 || !qp.Sort.Has("_id") {
		return params
	}

	unsorted := *params
	unsorted.Sort = nil

	return &unsorted
}
