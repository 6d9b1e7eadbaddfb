// pluginclient: an independent client for pcitopo's KubeVirt Plugin hooks (VEP 190), built with
// grpc-go from proto/testkit/hookproto/plugins_v1alpha1.proto (wire-identical to
// KubeVirt's pkg/hooks/plugins/v1alpha1/api.proto). It calls the way KubeVirt v1.9 does:
//   - mutate: virt-launcher's domain-hook sidecar client (pkg/virt-launcher/virtwrap/plugins):
//     the bare socket path, a unix dialer, insecure, a blocking dial bounded by 2 s, one call with
//     the hook's timeout (30 s, the Plugin CR's default), domain_type "libvirt";
//   - node: virt-handler's node-hook client, ExecuteNodeHook with the hook point, the VMI and the
//     node name; the VMI is read into v1.9.0's types and marshalled again, as virt-handler sends
//     json.Marshal of its *v1.VirtualMachineInstance (vmi.go), unless -raw sends the file as is
//     (what any other local client of the socket could send).
// grpc-go's default receive limit (4 MiB) applies, as it does in KubeVirt.
//
// Usage: pluginclient -socket PATH mutate -domain IN.xml -vmi VMI.json -context Boot -out OUT.xml
//        pluginclient -socket PATH node -hook PreVMStart -vmi VMI.json -node NAME [-raw]
//
// Prints one JSON line: {"ok": bool, "code": "...", "message": "..."}; exit 1 on any error.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/ioutil"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"pcitopo/hooks/plugins"
)

const dialTimeout = 2 * time.Second
const callTimeout = 30 * time.Second

func dial(socketPath string) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	return grpc.DialContext(ctx, socketPath,
		grpc.WithInsecure(),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		}),
	)
}

type report struct {
	OK      bool   `json:"ok"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	Bytes   int    `json:"bytes,omitempty"`
	Sent    int    `json:"sent,omitempty"` // node: the size of the VMI sent
}

func failed(err error) report {
	st, _ := status.FromError(err)
	return report{Code: st.Code().String(), Message: st.Message()}
}

func mutate(conn *grpc.ClientConn, args []string) report {
	fs := flag.NewFlagSet("mutate", flag.ExitOnError)
	domainPath := fs.String("domain", "", "domain XML")
	vmiPath := fs.String("vmi", "", "VMI JSON")
	invocation := fs.String("context", "Boot", "invocation context")
	domainType := fs.String("domain-type", "libvirt", "domain type")
	outPath := fs.String("out", "", "where the reply's domain goes")
	fs.Parse(args)
	domain, err := ioutil.ReadFile(*domainPath)
	if err != nil {
		return report{Message: err.Error()}
	}
	vmi, err := ioutil.ReadFile(*vmiPath)
	if err != nil {
		return report{Message: err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	r, err := plugins.NewDomainHookServiceClient(conn).MutateDomain(ctx, &plugins.MutateDomainRequest{
		DomainType: *domainType, Domain: domain, Vmi: vmi,
		SidecarContext: &plugins.SidecarContext{InvocationContext: *invocation},
	})
	if err != nil {
		return failed(err)
	}
	if len(r.GetDomain()) == 0 {
		return report{Message: "empty domain in the reply"}
	}
	if err := ioutil.WriteFile(*outPath, r.GetDomain(), 0o644); err != nil {
		return report{Message: err.Error()}
	}
	return report{OK: true, Bytes: len(r.GetDomain())}
}

func node(conn *grpc.ClientConn, args []string) report {
	fs := flag.NewFlagSet("node", flag.ExitOnError)
	hook := fs.String("hook", "PreVMStart", "hook point")
	vmiPath := fs.String("vmi", "", "VMI JSON")
	nodeName := fs.String("node", "", "node name")
	raw := fs.Bool("raw", false, "send the VMI file as is, not through KubeVirt v1.9.0's types")
	fs.Parse(args)
	vmi, err := ioutil.ReadFile(*vmiPath)
	if err != nil {
		return report{Message: err.Error()}
	}
	if !*raw {
		var typed VirtualMachineInstance
		if err := json.Unmarshal(vmi, &typed); err != nil {
			return report{Message: fmt.Sprintf("the VMI does not decode into KubeVirt v1.9.0's types: %v", err)}
		}
		if vmi, err = json.Marshal(&typed); err != nil {
			return report{Message: err.Error()}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	_, err = plugins.NewNodeHookServiceClient(conn).ExecuteNodeHook(ctx, &plugins.ExecuteNodeHookRequest{
		HookPoint: *hook, Vmi: vmi, NodeContext: &plugins.NodeContext{NodeName: *nodeName},
	})
	if err != nil {
		rep := failed(err)
		rep.Sent = len(vmi)
		return rep
	}
	return report{OK: true, Sent: len(vmi)}
}

func main() {
	socketPath := flag.String("socket", "", "the plugin's socket")
	flag.Parse()
	var rep report
	conn, err := dial(*socketPath)
	if err != nil {
		rep = report{Message: fmt.Sprintf("dial: %v", err)}
	} else {
		defer conn.Close()
		rest := flag.Args()
		switch {
		case len(rest) > 0 && rest[0] == "mutate":
			rep = mutate(conn, rest[1:])
		case len(rest) > 0 && rest[0] == "node":
			rep = node(conn, rest[1:])
		default:
			rep = report{Message: "usage: pluginclient -socket PATH mutate|node ..."}
		}
	}
	out, _ := json.Marshal(rep)
	fmt.Println(string(out))
	if !rep.OK {
		os.Exit(1)
	}
}
