package rdma_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// semver is a release version vMAJOR.MINOR.PATCH.
type semver [3]int

func parseSemver(s string) (semver, bool) {
	var v semver
	var rest string
	n, _ := fmt.Sscanf(s, "v%d.%d.%d%s", &v[0], &v[1], &v[2], &rest)
	return v, n >= 3 && rest == ""
}

func (v semver) String() string { return fmt.Sprintf("v%d.%d.%d", v[0], v[1], v[2]) }

func (v semver) less(w semver) bool {
	for i := range v {
		if v[i] != w[i] {
			return v[i] < w[i]
		}
	}
	return false
}

// next reports whether w is a release that can follow v: v with its
// patch, minor or major version raised by one.
func (v semver) next(w semver) bool {
	return w == semver{v[0], v[1], v[2] + 1} || w == semver{v[0], v[1] + 1, 0} || w == semver{v[0] + 1, 0, 0}
}

var (
	releaseHeading    = regexp.MustCompile(`(?m)^##\s+\[?(v\d+\.\d+\.\d+)\b`)
	unreleasedHeading = regexp.MustCompile(`(?mi)^##\s+\[?unreleased\b`)
	// A pin in a doc: go get github.com/go-rdma/rdma@vX.Y.Z.
	docPin = regexp.MustCompile(`github\.com/go-rdma/rdma@(v[0-9][^\s` + "`" + `"')]*)`)
	// A nested module's require of the library.
	modRequire = regexp.MustCompile(`(?m)^\s*(?:require\s+)?github\.com/go-rdma/rdma\s+(v\S+)`)
)

// changelogVersions returns the releases CHANGELOG.md lists (its "## vX.Y.Z"
// headings) and whether it has an "Unreleased" section with entries.
func changelogVersions(t *testing.T, text string) (releases []semver, unreleased bool) {
	t.Helper()
	for _, m := range releaseHeading.FindAllStringSubmatch(text, -1) {
		v, ok := parseSemver(m[1])
		require.True(t, ok, "CHANGELOG.md heading %q", m[0])
		releases = append(releases, v)
	}
	if loc := unreleasedHeading.FindStringIndex(text); loc != nil {
		section := text[loc[1]:]
		if i := strings.Index(section, "\n## "); i >= 0 {
			section = section[:i]
		}
		_, body, _ := strings.Cut(section, "\n")
		unreleased = strings.TrimSpace(body) != ""
	}
	return releases, unreleased
}

// pins walks the repository for the versions of go-rdma that docs pin
// (README.md, docs/, doc comments, scripts) and that nested modules
// require, by file.
func pins(t *testing.T) (docs, mods map[string]string) {
	t.Helper()
	docs, mods = map[string]string{}, map[string]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// tools is a module of its own for the linters, not of go-rdma.
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || path == "tools") {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		switch {
		case name == "go.mod" && path != "go.mod":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range modRequire.FindAllStringSubmatch(string(b), -1) {
				mods[path+" requires "+m[1]] = m[1]
			}
		case name == "CHANGELOG.md" || strings.HasSuffix(name, "_test.go"):
			// The CHANGELOG names past releases; tests hold patterns.
		case strings.HasSuffix(name, ".md") || strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".sh"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(b), "\n") {
				for _, m := range docPin.FindAllStringSubmatch(line, -1) {
					docs[fmt.Sprintf("%s:%d pins %s", path, i+1, m[1])] = m[1]
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	return docs, mods
}

// Rule: what a user is told to install has what the docs use. Every doc
// that pins a version of go-rdma (`go get github.com/go-rdma/rdma@V`) and
// every nested module (metrics/promrdma, cmd/examples/raftkv) that
// requires it names one version, the version of this tree: the newest
// release CHANGELOG.md lists, or, while its Unreleased section has
// entries (changes no release has), the release that follows it. A
// nested module built here (replace ../..) may use anything of this
// tree, so requiring an older release breaks it for a user who takes the
// module alone; the guide pinned v0.1.0, which has no stream package.
func TestVersionsMatchChangelog(t *testing.T) {
	b, err := os.ReadFile("CHANGELOG.md")
	require.NoError(t, err)
	releases, unreleased := changelogVersions(t, string(b))
	require.NotEmpty(t, releases, "CHANGELOG.md lists no release (## vX.Y.Z)")
	newest := releases[0]
	for _, v := range releases[1:] {
		if newest.less(v) {
			newest = v
		}
	}
	docs, mods := pins(t)
	require.NotEmpty(t, docs, "no doc pins a version of go-rdma: the walk missed README.md and docs/guide.md")
	require.NotEmpty(t, mods, "no nested module requires go-rdma: the walk missed metrics/promrdma")

	for where, s := range mods {
		v, ok := parseSemver(s)
		if !assert.True(t, ok, "%s: not a release version", where) {
			continue
		}
		assert.True(t, !v.less(newest), "%s, older than %s, the newest release CHANGELOG.md lists", where, newest)
	}
	all := map[string]string{}
	for k, v := range docs {
		all[k] = v
	}
	for k, v := range mods {
		all[k] = v
	}
	for where, s := range all {
		v, ok := parseSemver(s)
		if !assert.True(t, ok, "%s: not a release version", where) {
			continue
		}
		switch {
		case v == newest && !unreleased:
		case v == newest:
			t.Errorf("%s, but CHANGELOG.md's Unreleased section lists changes %s does not have: name the release that will have them", where, newest)
		case unreleased && newest.next(v):
		case unreleased:
			t.Errorf("%s: the release after %s, the newest CHANGELOG.md lists, is %s, %s or %s",
				where, newest, semver{newest[0], newest[1], newest[2] + 1}, semver{newest[0], newest[1] + 1, 0}, semver{newest[0] + 1, 0, 0})
		default:
			t.Errorf("%s: name %s, the newest release CHANGELOG.md lists", where, newest)
		}
	}
	seen := map[string][]string{}
	for where, s := range all {
		seen[s] = append(seen[s], where)
	}
	assert.True(t, len(seen) == 1, "the docs and nested modules name more than one version of go-rdma: %v", seen)
}

// Rule: the version check reads CHANGELOG.md as it is written.
func TestChangelogVersions(t *testing.T) {
	releases, unreleased := changelogVersions(t, "# Changelog\n\n## Unreleased\n\n## v0.2.0 (2027-01-10)\n- a\n## v0.1.0 (2026-12-01)\n- b\n")
	require.Equal(t, []semver{{0, 2, 0}, {0, 1, 0}}, releases)
	require.False(t, unreleased, "an empty Unreleased section")
	_, unreleased = changelogVersions(t, "## Unreleased\n\n### Fixes\n- c\n\n## v0.1.0\n")
	require.True(t, unreleased)
	require.True(t, semver{0, 1, 0}.next(semver{0, 2, 0}))
	require.True(t, semver{0, 1, 0}.next(semver{0, 1, 1}))
	require.False(t, semver{0, 1, 0}.next(semver{0, 3, 0}))
	require.True(t, semver{0, 1, 9}.less(semver{0, 2, 0}))
	_, ok := parseSemver("v0.2.0-rc1")
	require.False(t, ok)
}
