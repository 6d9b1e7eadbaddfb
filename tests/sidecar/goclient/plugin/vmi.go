package main

// What virt-handler v1.9.0 puts in ExecuteNodeHookRequest.vmi: it holds the VMI as KubeVirt's
// *v1.VirtualMachineInstance and sends json.Marshal of it (ExecuteNodeHook,
// pkg/hooks/plugins/v1alpha1/client.go). So a field the v1.9.0 types
// (staging/src/kubevirt.io/api/core/v1/types.go and schema.go) do not hold never reaches a node
// hook, whatever the stored object held. These types copy, with the same JSON names, tags and
// embedding, the part of the v1.9.0 types the node hook reads (metadata, the device requests,
// the resource claims, the status it could use); KubeVirt's own module cannot be built here
// offline. Everything else drops, as it would for a field v1.9.0 does not know.

type ObjectMeta struct {
	Name              string            `json:"name,omitempty"`
	Namespace         string            `json:"namespace,omitempty"`
	UID               string            `json:"uid,omitempty"`
	ResourceVersion   string            `json:"resourceVersion,omitempty"`
	Generation        int64             `json:"generation,omitempty"`
	CreationTimestamp *string           `json:"creationTimestamp"`
	Labels            map[string]string `json:"labels,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
}

// ClaimRequest is embedded in GPU and HostDevice with `json:",inline"`: encoding/json ignores
// the option, and an embedded struct without a JSON name has its fields promoted.
type ClaimRequest struct {
	ClaimName   string `json:"claimName,omitempty"`
	RequestName string `json:"requestName,omitempty"`
}

type GPU struct {
	Name          string `json:"name"`
	DeviceName    string `json:"deviceName,omitempty"`
	*ClaimRequest `json:",inline"`
	Tag           string `json:"tag,omitempty"`
}

type HostDevice struct {
	Name          string `json:"name"`
	DeviceName    string `json:"deviceName,omitempty"`
	*ClaimRequest `json:",inline"`
	Tag           string `json:"tag,omitempty"`
}

type InterfaceSRIOV struct{}

type Interface struct {
	Name  string          `json:"name"`
	SRIOV *InterfaceSRIOV `json:"sriov,omitempty"`
}

type Devices struct {
	GPUs        []GPU        `json:"gpus,omitempty"`
	HostDevices []HostDevice `json:"hostDevices,omitempty"`
	Interfaces  []Interface  `json:"interfaces,omitempty"`
}

type DomainSpec struct {
	Devices Devices `json:"devices"`
}

type VirtualMachineInstanceResourceClaim struct {
	Name                      string  `json:"name"`
	ResourceClaimName         *string `json:"resourceClaimName,omitempty"`
	ResourceClaimTemplateName *string `json:"resourceClaimTemplateName,omitempty"`
}

type VirtualMachineInstanceSpec struct {
	Domain         DomainSpec                            `json:"domain"`
	ResourceClaims []VirtualMachineInstanceResourceClaim `json:"resourceClaims,omitempty"`
}

// v1.9.0's status has no deviceStatus (removed in v1.8): not listed here, so it drops.
type VirtualMachineInstanceStatus struct {
	NodeName    string            `json:"nodeName,omitempty"`
	Phase       string            `json:"phase,omitempty"`
	ActivePods  map[string]string `json:"activePods,omitempty"`
	RuntimeUser uint64            `json:"runtimeUser"`
}

type VirtualMachineInstance struct {
	Kind       string                       `json:"kind,omitempty"`
	APIVersion string                       `json:"apiVersion,omitempty"`
	Metadata   ObjectMeta                   `json:"metadata,omitempty"`
	Spec       VirtualMachineInstanceSpec   `json:"spec" valid:"required"`
	Status     VirtualMachineInstanceStatus `json:"status,omitempty"`
}
