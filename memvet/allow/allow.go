package allow

import (
	"github.com/memgen/memgen/memvet/internal/vetspec"
	"golang.org/x/tools/go/analysis"
)

// Analyzer reports //memvet:allow comments that give no reason.
var Analyzer = &analysis.Analyzer{
	Name: "memvetallow",
	Doc:  "report //memvet:allow escapes that carry no reason",
	URL:  "https://github.com/memgen/memgen/blob/main/docs/memvet.md#the-escape",
	Run:  run,
}

func run(pass *analysis.Pass) (any, error) {
	for _, f := range pass.Files {
		for _, a := range vetspec.Allows(f) {
			if a.Reason == "" {
				pass.ReportRangef(a.Comment, "//memvet:allow needs a reason: say why the finding does not apply")
			}
		}
	}
	return nil, nil
}
