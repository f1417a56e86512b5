package diagnose

// The committed dumps' helpers, for the external tests (roundtrip_test.go:
// package diagnose_test, since harness/internal/diagnosetest imports this
// package).
var (
	DumpArchives = dumpArchives
	CaseOf       = caseOf
	ExtractDumps = extractDumps
)

// DumpsDir is where the committed dumps are (make diagnose-dumps).
const DumpsDir = dumpsDir
