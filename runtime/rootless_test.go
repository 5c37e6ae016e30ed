package runtime

import "testing"

func TestParseUIDMap(t *testing.T) {
	for _, tc := range []struct {
		name  string
		data  string
		whole bool
		root  int
	}{
		{"host", "         0          0 4294967295\n", true, 0},
		{"user mapped to root", "         0       1000          1\n", false, 1000},
		{"nobody mapped to root", "0 65534 1", false, 65534},
		{"subordinate range, root unmapped", "1 100000 65536\n", false, -1},
		{"root and a range", "0 1000 1\n1 100000 65536\n", false, 1000},
		{"empty", "", false, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole, root := parseUIDMap(tc.data)
			if whole != tc.whole || root != tc.root {
				t.Errorf("parseUIDMap(%q) = %v, %d; want %v, %d", tc.data, whole, root, tc.whole, tc.root)
			}
		})
	}
}

// TestUserNamespaceAsThisProcessSeesIt checks the view this process has of
// its own privileges: host root, or root of a user namespace that maps
// one host uid (the tests' TestMain puts an ordinary user there).
func TestUserNamespaceAsThisProcessSeesIt(t *testing.T) {
	switch {
	case HostRoot():
		if HostUID() != 0 {
			t.Errorf("host root, but HostUID() = %d", HostUID())
		}
	case inOwnUserNamespace():
		if HostUID() <= 0 {
			t.Errorf("in a user namespace, HostUID() = %d, want the user's uid", HostUID())
		}
		if err := UserNamespaceCapable(); err != nil {
			t.Errorf("root of this user namespace cannot mount: %v", err)
		}
	default:
		t.Skip("neither root nor in a user namespace: TestMain was not run")
	}
}
