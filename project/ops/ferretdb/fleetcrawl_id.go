// fleetcrawl's patch of FerretDB v1.24.2's SQLite backend (project/ops/install.py applies it).
//
// Upstream filters by `_id` as `_ferretdb_sjson->'$._id'` while the collection's unique index is
// on `_ferretdb_sjson->"_id"`: SQLite matches index expressions by their text, so every find,
// update and delete by `_id` scanned the whole table. The patch spells the column as the index
// does (metadata.IDColumn) and pushes down the `_id` part of any filter, equality or `$in` of
// strings and ObjectIDs, or a range of strings (fleetcrawl_order.go); the handler still applies
// the whole filter to what comes back.

package sqlite

import (
	"fmt"
	"strings"

	"github.com/FerretDB/FerretDB/internal/backends/sqlite/metadata"
	"github.com/FerretDB/FerretDB/internal/handler/sjson"
	"github.com/FerretDB/FerretDB/internal/types"
	"github.com/FerretDB/FerretDB/internal/util/must"
)

// fleetcrawlMaxIn is the most `$in` values pushed down (SQLite takes 32766 parameters).
const fleetcrawlMaxIn = 1000

// fleetcrawlIDWhere returns the WHERE clause and arguments for the `_id` part of filter, and
// whether that part is the whole filter; "" when filter has no `_id` part the index serves.
func fleetcrawlIDWhere(filter *types.Document) (string, []any, bool) {
	if filter == nil || !filter.Has("_id") {
		return "", nil, false
	}

	whole := filter.Len() == 1
	v := must.NotFail(filter.Get("_id"))

	switch v.(type) {
	case string, types.ObjectID:
		arg := string(must.NotFail(sjson.MarshalSingleValue(v)))
		return fmt.Sprintf(` WHERE %s = ?`, metadata.IDColumn), []any{arg}, whole
	case *types.Document:
		op := v.(*types.Document)
		if op.Len() != 1 || !op.Has("$in") {
			return fleetcrawlIDRange(op, whole)
		}

		values, ok := must.NotFail(op.Get("$in")).(*types.Array)
		if !ok || values.Len() == 0 || values.Len() > fleetcrawlMaxIn {
			return "", nil, false
		}

		marks := make([]string, values.Len())
		args := make([]any, values.Len())

		for i := 0; i < values.Len(); i++ {
			e := must.NotFail(values.Get(i))
			switch e.(type) {
			case string, types.ObjectID:
			default:
				return "", nil, false
			}

			marks[i] = "?"
			args[i] = string(must.NotFail(sjson.MarshalSingleValue(e)))
		}

		return fmt.Sprintf(` WHERE %s IN (%s)`, metadata.IDColumn, strings.Join(marks, ", ")), args, whole
	}

	return "", nil, false
}
