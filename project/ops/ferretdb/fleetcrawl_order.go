// fleetcrawl's patch of FerretDB v1.24.2's SQLite backend (project/ops/install.py applies it):
// pages of a collection in `_id` order, each at the cost of the page.
//
// Upstream never pushes a range of `_id` down to SQLite nor a sort by `_id`: a keyset page
// (`find({_id: {$gt: last}}).sort({_id: 1}).limit(n)`, fleetcrawl's exports and API) read and
// sorted the whole collection in memory, so a page cost as much as the collection. The patch
// pushes down a range of strings on `_id` and, with it, the sort by `_id` (and the limit when
// the range is the whole filter) onto an index of `_id` as SQL text, made the first time a
// table is paged this way: SQLite compares text as MongoDB compares strings (their UTF-8
// bytes), so its order is the handler's. The `_id` index FerretDB keeps is on `_id` as JSON,
// whose escapes (Go's `\u0026` for `&`) do not sort as the strings do. The index is made with
// each new collection (metadata/registry.go) and, for one made before the patch, the first
// time it is paged.

package sqlite

import (
	"context"
	"fmt"
	"strings"

	"github.com/FerretDB/FerretDB/internal/backends/sqlite/metadata"
	"github.com/FerretDB/FerretDB/internal/types"
	"github.com/FerretDB/FerretDB/internal/util/fsql"
	"github.com/FerretDB/FerretDB/internal/util/must"
)

// fleetcrawlIDText is `_id` as SQL text (a string's characters, unescaped).
const fleetcrawlIDText = metadata.DefaultColumn + `->>'$._id'`

// fleetcrawlIDRange returns the WHERE clause and arguments of op, `{$gt|$gte|$lt|$lte: string,
// ...}` on `_id`, and whole; "" for any other op. Only strings match a range of strings.
func fleetcrawlIDRange(op *types.Document, whole bool) (string, []any, bool) {
	// the type FerretDB's schema records: an ObjectID is stored as hex text too
	conds := []string{fmt.Sprintf(`%s->>'$."$s".p._id.t' = 'string'`, metadata.DefaultColumn)}
	args := []any{}

	for _, k := range op.Keys() {
		bound, ok := must.NotFail(op.Get(k)).(string)
		if !ok {
			return "", nil, false
		}

		var sign string

		switch k {
		case "$gt":
			sign = ">"
		case "$gte":
			sign = ">="
		case "$lt":
			sign = "<"
		case "$lte":
			sign = "<="
		default:
			return "", nil, false
		}

		conds = append(conds, fmt.Sprintf(`%s %s ?`, fleetcrawlIDText, sign))
		args = append(args, bound)
	}

	if len(args) == 0 {
		return "", nil, false
	}

	return ` WHERE ` + strings.Join(conds, ` AND `), args, whole
}

// fleetcrawlOrderByID returns the ORDER BY clause of a sort by `_id` (pushed down only with a
// range of strings, fleetcrawlIDRange).
func fleetcrawlOrderByID(sort *types.Document) string {
	order := ""

	switch v := must.NotFail(sort.Get("_id")).(type) {
	case int64:
		if v < 0 {
			order = " DESC"
		}
	case int32:
		if v < 0 {
			order = " DESC"
		}
	case float64:
		if v < 0 {
			order = " DESC"
		}
	}

	return fmt.Sprintf(" ORDER BY %s%s", fleetcrawlIDText, order)
}

// fleetcrawlTextIndex makes the index of `_id` as text on table if whereClause needs it and it
// is not there yet (a read of the schema each time: a table dropped and made again under the
// same name lost it).
func fleetcrawlTextIndex(ctx context.Context, db *fsql.DB, table, whereClause string) {
	if !strings.Contains(whereClause, fleetcrawlIDText) {
		return
	}

	name := table + "_fleetcrawl_id_text"

	var found int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?`, name).Scan(&found); err != nil || found > 0 {
		return
	}

	_, _ = db.ExecContext(ctx, fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %q ON %q (%s)`, name, table, fleetcrawlIDText))
}
