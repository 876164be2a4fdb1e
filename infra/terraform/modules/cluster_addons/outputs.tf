output "releases" {
  description = "Installed add-on releases and their chart versions."
  value = {
    (helm_release.cluster_autoscaler.name)   = helm_release.cluster_autoscaler.version
    (helm_release.nvidia_device_plugin.name) = helm_release.nvidia_device_plugin.version
  }
}
