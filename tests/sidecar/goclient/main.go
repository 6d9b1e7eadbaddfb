// hookclient: an independent client for the KubeVirt hook sidecar protocol, built with grpc-go
// from the hook .proto files in proto/ (wire-identical to KubeVirt's pkg/hooks/info and
// pkg/hooks/v1alpha1..3). It calls a sidecar socket the way virt-launcher's hook manager
// (KubeVirt pkg/hooks/manager.go) does, with the dial of pkg/util/net/grpc
// DialSocketWithTimeout(path, 1): the bare socket path as the target, a unix dialer, insecure,
// authority "localhost", a blocking dial bounded by 2 s, and a fresh connection for every call.
// Info has a 1 s deadline; the newest version both sides know is chosen (v1alpha3, then
// v1alpha2, then v1alpha1) unless -version forces one; OnDefineDomain has a 1 minute deadline.
// grpc-go's default receive limit (4 MiB) applies, as it does in virt-launcher.
//
// Usage: hookclient -socket PATH [-version auto|v1alpha1|v1alpha2|v1alpha3]
//
//	[-domain IN.xml -vmi VMI.json -out OUT.xml] [-shutdown]
//
// Prints one JSON line: {"info": {...}, "version": "...", "error": "..."}; exit 1 on any error.
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

	"pcitopo/hooks/info"
	"pcitopo/hooks/v1alpha1"
	"pcitopo/hooks/v1alpha2"
	"pcitopo/hooks/v1alpha3"
)

const connectTimeout = 2 * time.Second

// dial: KubeVirt's DialSocketWithTimeout(socketPath, 1), option for option.
func dial(socketPath string) (*grpc.ClientConn, error) {
	options := []grpc.DialOption{
		grpc.WithAuthority("localhost"),
		grpc.WithInsecure(),
		grpc.WithDialer(func(addr string, timeout time.Duration) (net.Conn, error) {
			return net.DialTimeout("unix", addr, timeout)
		}),
		grpc.WithBlock(),
		grpc.WithTimeout(time.Duration(1)*time.Second + connectTimeout),
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	return grpc.DialContext(ctx, socketPath, options...)
}

type hookPoint struct {
	Name     string `json:"name"`
	Priority int32  `json:"priority"`
}

type infoOut struct {
	Name       string      `json:"name"`
	HookPoints []hookPoint `json:"hookPoints"`
	Versions   []string    `json:"versions"`
}

type report struct {
	Info     *infoOut `json:"info,omitempty"`
	Version  string   `json:"version,omitempty"`
	Defined  bool     `json:"defined"`
	Shutdown bool     `json:"shutdown"`
	Error    string   `json:"error,omitempty"`
}

func callInfo(socketPath string) (*info.InfoResult, error) {
	conn, err := dial(socketPath)
	if err != nil {
		return nil, fmt.Errorf("dial: %v", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return info.NewInfoClient(conn).Info(ctx, &info.InfoParams{})
}

func pickVersion(offered []string, forced string) (string, error) {
	set := map[string]bool{}
	for _, v := range offered {
		set[v] = true
	}
	if forced != "auto" {
		if !set[forced] {
			return "", fmt.Errorf("sidecar does not offer %s (offers %v)", forced, offered)
		}
		return forced, nil
	}
	for _, v := range []string{"v1alpha3", "v1alpha2", "v1alpha1"} {
		if set[v] {
			return v, nil
		}
	}
	return "", fmt.Errorf("hook sidecar does not expose a supported version: %v", offered)
}

func onDefineDomain(socketPath, version string, domainXML, vmi []byte) ([]byte, error) {
	conn, err := dial(socketPath)
	if err != nil {
		return nil, fmt.Errorf("dial: %v", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch version {
	case "v1alpha1":
		r, err := v1alpha1.NewCallbacksClient(conn).OnDefineDomain(ctx, &v1alpha1.OnDefineDomainParams{DomainXML: domainXML, Vmi: vmi})
		return r.GetDomainXML(), err
	case "v1alpha2":
		r, err := v1alpha2.NewCallbacksClient(conn).OnDefineDomain(ctx, &v1alpha2.OnDefineDomainParams{DomainXML: domainXML, Vmi: vmi})
		return r.GetDomainXML(), err
	default:
		r, err := v1alpha3.NewCallbacksClient(conn).OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: domainXML, Vmi: vmi})
		return r.GetDomainXML(), err
	}
}

func shutdown(socketPath string) error {
	conn, err := dial(socketPath)
	if err != nil {
		return fmt.Errorf("dial: %v", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = v1alpha3.NewCallbacksClient(conn).Shutdown(ctx, &v1alpha3.ShutdownParams{})
	return err
}

func run(socketPath, forced, domainPath, vmiPath, outPath string, doShutdown bool) report {
	var rep report
	res, err := callInfo(socketPath)
	if err != nil {
		rep.Error = fmt.Sprintf("Info: %v", err)
		return rep
	}
	rep.Info = &infoOut{Name: res.GetName(), Versions: res.GetVersions(), HookPoints: []hookPoint{}}
	for _, hp := range res.GetHookPoints() {
		rep.Info.HookPoints = append(rep.Info.HookPoints, hookPoint{hp.GetName(), hp.GetPriority()})
	}
	if rep.Version, err = pickVersion(res.GetVersions(), forced); err != nil {
		rep.Error = err.Error()
		return rep
	}
	if domainPath != "" {
		domainXML, err1 := ioutil.ReadFile(domainPath)
		vmi, err2 := ioutil.ReadFile(vmiPath)
		if err1 != nil || err2 != nil {
			rep.Error = fmt.Sprintf("reading inputs: %v %v", err1, err2)
			return rep
		}
		out, err := onDefineDomain(socketPath, rep.Version, domainXML, vmi)
		if err != nil {
			rep.Error = fmt.Sprintf("OnDefineDomain: %v", err)
			return rep
		}
		if err := ioutil.WriteFile(outPath, out, 0o644); err != nil {
			rep.Error = err.Error()
			return rep
		}
		rep.Defined = true
	}
	if doShutdown {
		if err := shutdown(socketPath); err != nil {
			rep.Error = fmt.Sprintf("Shutdown: %v", err)
			return rep
		}
		rep.Shutdown = true
	}
	return rep
}

func main() {
	socketPath := flag.String("socket", "", "sidecar socket path")
	forced := flag.String("version", "auto", "auto|v1alpha1|v1alpha2|v1alpha3")
	domainPath := flag.String("domain", "", "domain XML to send to OnDefineDomain")
	vmiPath := flag.String("vmi", "", "VMI JSON to send with it")
	outPath := flag.String("out", "", "where to write the returned domain XML")
	doShutdown := flag.Bool("shutdown", false, "call v1alpha3 Shutdown last")
	flag.Parse()
	rep := run(*socketPath, *forced, *domainPath, *vmiPath, *outPath, *doShutdown)
	line, _ := json.Marshal(rep)
	fmt.Println(string(line))
	if rep.Error != "" {
		os.Exit(1)
	}
}
