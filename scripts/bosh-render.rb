#!/usr/bin/env ruby
# frozen_string_literal: true
#
# Render every template of a BOSH job the way the director and bosh-cli do, without either:
#
#   ruby scripts/bosh-render.rb JOB_DIR PROPERTIES.yml OUT_DIR
#
# JOB_DIR holds `spec` and `templates/`; PROPERTIES.yml is the job's properties as a manifest
# gives them (nested hashes); each template named in the spec's `templates` is written to
# OUT_DIR/<destination>. As in bosh (bosh-template's EvaluationContext): the properties a
# template sees are those the spec declares, each the manifest's value or else the spec's
# default; ERB runs with trim_mode '-'; `p(name)` / `p([names], default)`, `if_p(*names) {...}
# .else {...}`, `spec.*` and `link` behave the same. One rule is stricter than bosh on purpose:
# a template that names a property the spec does not declare fails even when `p` is given a
# default, because a property missing from the spec cannot be set by an operator.
# Exit status: 0 rendered, 1 a template failed (the message names the template and the reason),
# 2 bad arguments.

require 'erb'
require 'json'
require 'yaml'
require 'fileutils'

# A property name the spec does not declare.
class UndeclaredProperty < StandardError; end
# A declared property without value or default.
class UnsetProperty < StandardError; end

# Resolve the declared properties from the manifest's values and the spec's defaults into one
# nested hash, as bosh does: a property with neither value nor default is absent.
def resolve(declared, given)
  declared.each_with_object({}) do |(name, definition), out|
    path = name.split('.')
    value = path.reduce(given) { |h, k| h.is_a?(Hash) ? h[k] : nil }
    value = (definition || {})['default'] if value.nil?
    next if value.nil?

    *parents, leaf = path
    parents.reduce(out) { |h, k| h[k] ||= {} }[leaf] = value
  end
end

# What `spec` answers in a template (values a single-instance deployment would have).
InstanceSpec = Struct.new(:name, :deployment, :index, :id, :az, :bootstrap, :address, :ip,
                          :networks, :job, :release, keyword_init: true)

# What `if_p` returns: `else` and `else_if_p` run only when no earlier branch did.
class ElseBlock
  def initialize(context, active)
    @context = context
    @active = active
  end

  def else
    yield if @active
  end

  def else_if_p(*names, &block)
    @active ? @context.if_p(*names, &block) : self
  end
end

# The object a template is evaluated in.
class Context
  attr_reader :spec

  def initialize(job_name, declared, properties)
    @declared = declared
    @properties = properties
    @spec = InstanceSpec.new(
      name: job_name, deployment: 'render-check', index: 0,
      id: '00000000-0000-4000-8000-000000000000', az: 'z1', bootstrap: true,
      address: '10.0.0.6', ip: '10.0.0.6', networks: {}, job: Struct.new(:name).new(job_name),
      release: Struct.new(:name, :version).new('stemcell-gallery', '0+dev')
    )
  end

  # A declared property's value, or the hash of the declared properties under a prefix
  # (`p('azure.azure_stack')`); nil when unset.
  def lookup(name)
    known = @declared.any? { |d| d == name || d.start_with?("#{name}.") }
    raise UndeclaredProperty, "property #{name.inspect} is not declared in the job's spec" unless known

    name.split('.').reduce(@properties) { |h, k| h.is_a?(Hash) ? h[k] : nil }
  end

  def p(*args)
    names = Array(args[0])
    names.each do |name|
      value = lookup(name)
      return value unless value.nil?
    end
    return args[1] if args.length == 2

    raise UnsetProperty, "property #{names.join(' or ')} has no value and no default (set it in the manifest)"
  end

  def if_p(*names)
    values = names.map { |n| lookup(n) }
    return ElseBlock.new(self, true) if values.any?(&:nil?)

    yield(*values)
    ElseBlock.new(self, false)
  end

  def link(name)
    raise ArgumentError, "link(#{name.inspect}): this renderer has no links (the job declares none)"
  end

  def if_link(name)
    raise ArgumentError, "if_link(#{name.inspect}): this renderer has no links (the job declares none)"
  end

  def render(text)
    ERB.new(text, trim_mode: '-').result(binding)
  end
end

if ARGV.length != 3
  warn 'usage: ruby scripts/bosh-render.rb JOB_DIR PROPERTIES.yml OUT_DIR'
  exit 2
end
job_dir, properties_file, out_dir = ARGV
begin
  spec = YAML.safe_load(File.read(File.join(job_dir, 'spec')))
  given = YAML.safe_load(File.read(properties_file)) || {}
rescue StandardError => e
  warn "cannot read the job or the properties: #{e.message}"
  exit 2
end
declared = spec['properties'] || {}
properties = resolve(declared, given)
failed = false
(spec['templates'] || {}).each do |source, destination|
  begin
    text = File.read(File.join(job_dir, 'templates', source))
    rendered = Context.new(spec['name'], declared.keys, properties).render(text)
    target = File.join(out_dir, destination)
    FileUtils.mkdir_p(File.dirname(target))
    File.write(target, rendered)
    File.chmod(0o755, target) if destination.start_with?('bin/')
  rescue StandardError, ScriptError => e
    warn "#{spec['name']}: template #{source} (#{destination}): #{e.class}: #{e.message}"
    failed = true
  end
end
exit(failed ? 1 : 0)
